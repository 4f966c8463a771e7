#include "common/utf8.h"

namespace divlab {

bool decode_utf8(std::string_view s, size_t& i, char32_t& code_point) {
  const unsigned char c = s[i];
  if (c < 0x80) {
    code_point = c;
    ++i;
    return true;
  }
  int extra = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the byte after the lead
  if (c >= 0xc2 && c <= 0xdf) {
    extra = 1, code_point = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    extra = 2, code_point = c & 0x0f;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    extra = 3, code_point = c & 0x07;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return false;
  }
  if (i + extra >= s.size()) return false;
  for (int k = 1; k <= extra; ++k) {
    const unsigned char b = s[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b >> 6) != 2) return false;
    code_point = (code_point << 6) | (b & 0x3f);
  }
  i += extra + 1;
  return true;
}

size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  char32_t c = 0;
  while (i < s.size()) {
    if (s[i] == 0) return i;
    if (!decode_utf8(s, i, c)) return i;
  }
  return std::string_view::npos;
}

std::string one_line(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xc0 | (c >> 6));
    out += char(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += char(0xe0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  } else {
    out += char(0xf0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3f));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  }
}

}  // namespace divlab
