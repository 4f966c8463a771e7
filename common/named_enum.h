// Closed sets of named values (optimizer, LR schedule, ...): one table per enum, from which
// parsing, printing and the config schema's choices all come, so each name is spelled once and a
// value travels typed from the config file to the code that branches on it.
//
// An enum opts in by specialising EnumNames with a `table` of {value, name} pairs:
//   template <> struct EnumNames<LrSchedule> {
//     static constexpr std::pair<LrSchedule, const char*> table[] = {{LrSchedule::Constant,
//     "constant"}, {LrSchedule::Cosine, "cosine"}};
//   };
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace divlab {

template <class E>
struct EnumNames;

template <class E>
const char* name_of(E value) {
  for (const auto& [v, name] : EnumNames<E>::table)
    if (v == value) return name;
  throw std::logic_error("an enum value without a name");
}

// Every name, in table order (a config key's choices).
template <class E>
std::vector<std::string> names_of() {
  std::vector<std::string> out;
  for (const auto& entry : EnumNames<E>::table) out.emplace_back(entry.second);
  return out;
}

// The value named `name`; false if there is none (the caller says which key was wrong).
template <class E>
bool parse_name(const std::string& name, E* out) {
  for (const auto& [v, n] : EnumNames<E>::table)
    if (name == n) {
      *out = v;
      return true;
    }
  return false;
}

// "a, b or c": the valid names, for a message.
template <class E>
std::string names_text() {
  const auto names = names_of<E>();
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

}  // namespace divlab
