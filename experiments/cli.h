// The command line: each command's options and what runs it (experiments/cli_run.cpp: the
// commands that train and experiment; experiments/cli_inspect.cpp: those that read and report),
// and what they share. experiments/main.cpp parses and maps errors to exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>

#include "common/errors.h"
#include "common/named_enum.h"

namespace divlab {

// Unsigned options: CLI11 reads "-1" into a uint64_t as 2^64 - 1, and an int option's "-1" would
// mean "not given" (sweep --cell), so a sign is refused before conversion; CLI11 2.1 also reads
// a seed past 2^64 - 1 as 2^64 - 1, so that is refused too (a replayed seed must be the one given).
inline const CLI::Validator kNotNegative(
    [](std::string& value) {
      if (!value.empty() && value[0] == '-') return "'" + value + "': must be >= 0";
      errno = 0;
      std::strtoull(value.c_str(), nullptr, 0);
      return errno == ERANGE ? "'" + value + "': at most 2^64 - 1" : std::string();
    },
    "N >= 0");

// A path given as '' (an unset shell variable, say) is refused: a command would otherwise take it
// for an option not given and run something else (the default grid, a check without the trace).
inline const CLI::Validator kPathGiven(
    [](std::string& value) { return value.empty() ? std::string("an empty path") : std::string(); },
    "");

// Every option that takes a number gets this (experiments/main.cpp): CLI11 reads '' as 0, which
// most of them would take for "not given" (--jobs '': every core; --seed '': a fresh seed) and
// --stop-grace for no grace at all.
inline const CLI::Validator kNumberGiven(
    [](std::string& value) {
      return value.empty() ? std::string("an empty value (a number is expected)") : std::string();
    },
    "");

// A command-line option's value from a closed set, parsed once; one line naming the option
// and the valid values otherwise.
template <class E>
E option_choice(const std::string& option, const std::string& value) {
  E v{};
  if (!parse_name(value, &v))
    throw InputError(option + " '" + value + "': expected " + names_text<E>());
  return v;
}

// A command: its subcommand (true once the command line chose it) and what runs it, returning
// the exit code; what it throws main maps to one (InputError: 2).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// In `divlab --help`'s order.
Command add_train_command(CLI::App& app);
Command add_check_command(CLI::App& app);
Command add_bisect_command(CLI::App& app);
Command add_data_command(CLI::App& app);
Command add_sample_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_kernels_command(CLI::App& app);
Command add_sweep_command(CLI::App& app);
Command add_analyze_command(CLI::App& app);
Command add_reproduce_command(CLI::App& app);

}  // namespace divlab
