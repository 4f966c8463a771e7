// TOML documents read with toml++ (a complete TOML 1.0 parser: multi-line arrays, inline tables,
// 1_024, a table defined twice refused) and flattened to dotted keys in file order, each value
// with its TOML type and line, so that callers check types strictly and name the line.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace divlab {

struct TomlValue {
  enum class Kind { Integer, Float, Boolean, String, Array };
  Kind kind = Kind::String;
  // Integer: decimal; Float: the shortest text that reads back the same double ("inf", "nan"
  // for those); Boolean: true or false; String: its content; Array: empty.
  std::string text;
  std::vector<TomlValue> items;  // Array: its elements
  int line = 0;                  // 1-based line in its document; 0 when not from one
  bool bare = false;             // from the command line and not TOML: the text as typed

  // As TOML value text: strings quoted and escaped, arrays bracketed (read_toml_value's inverse).
  std::string toml() const;
  // For messages: `an integer (3)`, `a string ("0.1")`, `an array of 2 values`, `'eight'`.
  std::string describe() const;
};

struct TomlEntry {
  std::string key;  // tables and key joined with '.', e.g. "axes.train.seed"
  TomlValue value;
};

// The shortest text that reads back as exactly `x` (std::to_chars): 0.1, 1e-05, inf; never an
// integer past TOML's 64-bit range (9.223372036854776e+18, not 9223372036854775808).
std::string float_text(double x);

// Parses a document; `source` names it in messages (e.g. "config file 'c.toml'"). Throws
// InputError "SOURCE line L, column C: what is wrong" for malformed TOML and for what no
// divlab file holds (dates and times, arrays of tables, tables inside arrays).
std::vector<TomlEntry> read_toml(const std::string& text, const std::string& source);

// The entries as a document of dotted keys, one per line, in their order (what read_toml reads
// back as the same entries; comments are not kept). Key segments are split at '.'.
std::string toml_document(const std::vector<TomlEntry>& entries);

// A document as key -> value text (arrays: their items' texts joined with ','), for readers that
// need a recorded config's values, not its checks (analysis, export).
std::map<std::string, std::string> read_toml_texts(const std::string& text,
                                                   const std::string& source);

// One value typed on the command line (`--set key=VALUE`, a grid's axis value): TOML if the text
// is one TOML value; otherwise the text itself as a bare string (`data=zipf:1.1` needs no
// quotes), and `[a=b, c=d]` a list of bare strings (an item left out between commas: InputError).
TomlValue read_toml_value(const std::string& text);

}  // namespace divlab
