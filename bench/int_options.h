// The GEMM benchmarks' command lines: `--name value` pairs, each value a positive integer.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

// Sets the named options' integers from argv; on a bad line prints one line naming the option and
// returns 2 (the caller exits with it), else 0.
inline int parse_int_options(const char* program, int argc, char** argv,
                             const std::map<std::string, int*>& options) {
  for (int i = 1; i < argc; i += 2) {
    const auto it = options.find(argv[i]);
    if (it == options.end()) {
      std::fprintf(stderr, "%s: unknown option '%s'\n", program, argv[i]);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s: missing value\n", program, argv[i]);
      return 2;
    }
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(argv[i + 1], &end, 10);
    if (errno != 0 || end == argv[i + 1] || *end != '\0' || v <= 0 || v > 1 << 30) {
      std::fprintf(stderr, "%s: %s %s: expected a positive integer\n", program, argv[i],
                   argv[i + 1]);
      return 2;
    }
    *it->second = int(v);
  }
  return 0;
}
