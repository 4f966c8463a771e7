#include "io/toml_reader.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string_view>

#include "common/errors.h"
#include "common/utf8.h"

namespace divlab {
namespace {

// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable when it asks whether some non-ASCII
// code points are whitespace (upstream issues #190 and #295, fixed after 3.3.0): undefined
// behaviour for an accented letter or a kana in the wrong place (our fuzzer found it). Until
// the fix ships, those code points pass through the parser as private-use code points of plane
// 15, which it classifies without harm, and are restored in every key, string and message.
struct CodePoints {
  char32_t first, last;
};
constexpr CodePoints kUnsafe[] = {
    {0xa1, 0x499}, {0x2c5e, 0x2fff}, {0x3001, 0x3057}, {0xfb26, 0xfefe}};
constexpr char32_t kStandIns = 0xf0000;  // Supplementary Private Use Area-A
constexpr char32_t unsafe_count() {
  char32_t n = 0;
  for (const CodePoints& r : kUnsafe) n += r.last - r.first + 1;
  return n;
}
bool is_stand_in(char32_t c) {
  return c >= kStandIns && c < kStandIns + unsafe_count();
}

std::string with_stand_ins(const std::string& text, const std::string& source) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) return text;
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  size_t i = 0;
  int line = 1;
  while (i < text.size()) {
    char32_t c = 0;
    if (!decode_utf8(text, i, c))
      throw InputError(source + " line " + std::to_string(line) + ": invalid UTF-8");
    if (c == '\n') ++line;
    if (is_stand_in(c))
      throw InputError(source + " line " + std::to_string(line) +
                       ": private-use characters U+F0000-U+F0BCA are not read here");
    char32_t offset = 0;
    for (const CodePoints& r : kUnsafe) {
      if (c >= r.first && c <= r.last) {
        c = kStandIns + offset + (c - r.first);
        break;
      }
      offset += r.last - r.first + 1;
    }
    append_utf8(out, c);
  }
  return out;
}

std::string without_stand_ins(const std::string& text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) return text;
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    char32_t c = 0;
    if (!decode_utf8(text, i, c)) {  // toml++ writes only UTF-8; keep any other byte as it is
      out += text[i++];
      continue;
    }
    if (is_stand_in(c)) {
      char32_t offset = c - kStandIns;
      for (const CodePoints& r : kUnsafe) {
        if (offset <= r.last - r.first) {
          c = r.first + offset;
          break;
        }
        offset -= r.last - r.first + 1;
      }
    }
    append_utf8(out, c);
  }
  return out;
}

std::string quoted(const std::string& s) {
  // Quotes and backslashes escaped first, so that one_line's escapes of the control characters
  // (which TOML's basic strings may not hold, DEL included) stay single.
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return "\"" + one_line(out) + "\"";
}

[[noreturn]] void refuse(const std::string& source, const toml::source_region& at,
                         const std::string& what) {
  throw InputError(source + " line " + std::to_string(at.begin.line) + ", column " +
                   std::to_string(at.begin.column) + ": " + what);
}

TomlValue convert(const toml::node& node, const std::string& key, const std::string& source) {
  TomlValue v;
  v.line = int(node.source().begin.line);
  switch (node.type()) {
    case toml::node_type::integer:
      v.kind = TomlValue::Kind::Integer;
      v.text = std::to_string(node.as_integer()->get());
      break;
    case toml::node_type::floating_point:
      v.kind = TomlValue::Kind::Float;
      v.text = float_text(node.as_floating_point()->get());
      break;
    case toml::node_type::boolean:
      v.kind = TomlValue::Kind::Boolean;
      v.text = node.as_boolean()->get() ? "true" : "false";
      break;
    case toml::node_type::string:
      v.kind = TomlValue::Kind::String;
      v.text = without_stand_ins(node.as_string()->get());
      // Every message quoting the value would end at it, and no key takes one.
      if (v.text.find('\0') != std::string::npos)
        refuse(source, node.source(), "'" + key + "': a NUL character (\\u0000) in a string");
      break;
    case toml::node_type::array:
      v.kind = TomlValue::Kind::Array;
      for (const toml::node& item : *node.as_array()) {
        if (item.is_table())
          refuse(source, item.source(), "'" + key + "': tables inside an array are not used here");
        v.items.push_back(convert(item, key, source));
      }
      break;
    default:
      refuse(source, node.source(),
             "'" + key + "': dates and times are not used here (quote the value)");
  }
  return v;
}

// Depth first; the caller sorts by position, since toml++ keeps a table's keys sorted by name.
struct Positioned {
  toml::source_position at;
  TomlEntry entry;
};
void flatten(const toml::table& table, const std::string& prefix, const std::string& source,
             std::vector<Positioned>& out) {
  for (const auto& [name, node] : table) {
    const std::string key =
        prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    if (node.is_table()) {
      flatten(*node.as_table(), key, source, out);
    } else if (node.is_array_of_tables()) {
      refuse(source, node.source(), "'" + key + "': arrays of tables are not used here");
    } else {
      out.push_back({node.source().begin, {key, convert(node, key, source)}});
    }
  }
}

}  // namespace

std::string float_text(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  // The shortest text of an integral value from 2^63 up can be all digits ("9223372036854775808"),
  // which TOML reads as an integer out of its 64-bit range: a config written from it would not
  // read back. Such values are written with an exponent.
  if (std::abs(x) >= 0x1p63 &&
      std::string_view(buf, size_t(r.ptr - buf)).find_first_of(".e") == std::string_view::npos)
    r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  return std::string(buf, r.ptr);
}

std::string TomlValue::toml() const {
  switch (kind) {
    case Kind::String:
      return quoted(text);
    case Kind::Array: {
      std::string out = "[";
      for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i].toml();
      return out + "]";
    }
    default:
      return text;
  }
}

namespace {
// As toml(), with an integral float written 1.0: "1" would read back as an integer. (toml()
// keeps "1": grid cells' override texts, and so grid ids, are made from it.)
std::string typed_toml(const TomlValue& v) {
  if (v.kind == TomlValue::Kind::Float && v.text.find_first_of(".eEni") == std::string::npos)
    return v.text + ".0";
  if (v.kind != TomlValue::Kind::Array) return v.toml();
  std::string out = "[";
  for (size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + typed_toml(v.items[i]);
  return out + "]";
}
}  // namespace

std::string toml_document(const std::vector<TomlEntry>& entries) {
  std::string out;
  for (const TomlEntry& e : entries) {
    // Each segment bare where TOML allows it, else quoted.
    std::string key;
    size_t start = 0;
    while (start <= e.key.size()) {
      const size_t dot = std::min(e.key.find('.', start), e.key.size());
      const std::string part = e.key.substr(start, dot - start);
      const bool bare = !part.empty() && part.find_first_not_of(
                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                             "0123456789_-") == std::string::npos;
      key += (key.empty() ? "" : ".") + (bare ? part : quoted(part));
      start = dot + 1;
    }
    out += key + " = " + typed_toml(e.value) + "\n";
  }
  return out;
}

std::string TomlValue::describe() const {
  if (bare) return "'" + text + "'";
  switch (kind) {
    case Kind::Integer:
      return "an integer (" + text + ")";
    case Kind::Float:  // 8.0, not 8: the reader must see why an integer key refuses it
      return "a float (" + text + (text.find_first_of(".eEn") == std::string::npos ? ".0" : "") +
             ")";
    case Kind::Boolean:
      return "a boolean (" + text + ")";
    case Kind::String:
      return "a string (" + quoted(text) + ")";
    case Kind::Array:
      return "an array of " + std::to_string(items.size()) +
             (items.size() == 1 ? " value" : " values");
  }
  return "?";
}

std::vector<TomlEntry> read_toml(const std::string& text, const std::string& source) {
  toml::table doc;
  try {
    doc = toml::parse(with_stand_ins(text, source));
  } catch (const toml::parse_error& e) {
    std::string what = without_stand_ins(std::string(e.description()));
    std::replace(what.begin(), what.end(), '\n', ' ');
    refuse(source, e.source(), what);
  }
  std::vector<Positioned> found;
  flatten(doc, "", source, found);
  std::stable_sort(found.begin(), found.end(), [](const Positioned& a, const Positioned& b) {
    return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
  });
  std::vector<TomlEntry> out;
  out.reserve(found.size());
  for (auto& f : found) out.push_back(std::move(f.entry));
  return out;
}

std::map<std::string, std::string> read_toml_texts(const std::string& text,
                                                   const std::string& source) {
  std::map<std::string, std::string> out;
  for (const TomlEntry& e : read_toml(text, source)) {
    std::string v = e.value.text;
    if (e.value.kind == TomlValue::Kind::Array) {
      v.clear();
      for (size_t i = 0; i < e.value.items.size(); ++i) v += (i ? "," : "") + e.value.items[i].text;
    }
    out[e.key] = v;
  }
  return out;
}

TomlValue read_toml_value(const std::string& text) {
  // A newline could smuggle in a second key; such text is taken as it is.
  if (text.find_first_of("\r\n") == std::string::npos) {
    try {
      const toml::table doc = toml::parse("v = " + with_stand_ins(text, "--set"));
      if (doc.size() == 1 && doc.contains("v") && !doc["v"].is_table()) {
        TomlValue v = convert(*doc.get("v"), "value", "--set");
        v.line = 0;
        for (auto& item : v.items) item.line = 0;
        return v;
      }
    } catch (const std::exception&) {
      // not one TOML value: a bare string (or list of them) below
    }
  }
  const auto trim = [](const std::string& s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  TomlValue v;
  v.bare = true;
  const std::string t = trim(text);
  if (t.size() >= 2 && t.front() == '[' && t.back() == ']') {
    v.kind = TomlValue::Kind::Array;
    v.text = t;
    // The items between the commas; as in TOML, [] and one trailing comma, but no item left out
    // ([a,,b], [,a], [,]).
    std::vector<std::string> parts;
    const std::string inner = trim(t.substr(1, t.size() - 2));
    for (size_t begin = 0; !inner.empty();) {
      const size_t comma = inner.find(',', begin);
      parts.push_back(trim(inner.substr(begin, comma - begin)));
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
    if (parts.size() > 1 && parts.back().empty()) parts.pop_back();
    for (const std::string& item : parts) {
      if (item.empty()) throw InputError("a list item is missing between its commas");
      TomlValue element;
      element.bare = true;
      element.text = item;
      const char q = item.front();
      if (item.size() >= 2 && (q == '"' || q == '\'') && item.back() == q)
        element.text = item.substr(1, item.size() - 2);
      v.items.push_back(element);
    }
    return v;
  }
  v.text = t;
  return v;
}

}  // namespace divlab
