// UTF-8 as RFC 3629 defines it, for corpora and configs: the one decoder both use.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace divlab {

// Decodes the code point at s[i] and moves i past it; false (i unchanged) where s[i] does not
// start a valid sequence: a continuation byte without a lead, C0, C1, F5-FF, an overlong form
// (E0 80-9F, F0 80-8F), a UTF-16 surrogate (ED A0-BF), a code point above U+10FFFF (F4 90-BF),
// or a sequence cut off by the end of `s`.
bool decode_utf8(std::string_view s, size_t& i, char32_t& code_point);

// Offset of the first byte that is not valid UTF-8, or of the first NUL, or npos.
size_t first_invalid_utf8(std::string_view s);

// Appends `code_point` (at most U+10FFFF, not a surrogate) encoded as UTF-8.
void append_utf8(std::string& out, char32_t code_point);

// `s` on one line: control characters (a newline inside a value a user gave) written as escapes
// both C and TOML read (\n, \t, \r, \u00XX), so a message quoting the value stays one line.
std::string one_line(std::string_view s);

}  // namespace divlab
