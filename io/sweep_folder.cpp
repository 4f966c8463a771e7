#include "io/sweep_folder.h"

#include <charconv>
#include <cstdio>
#include <fstream>

namespace divlab {

std::string cell_trace_path(const std::string& dir, size_t cell) {
  char name[32];
  std::snprintf(name, sizeof name, "/cells/%04zu", cell);
  return dir + name + ".h5";
}

std::string cell_log_path(const std::string& dir, size_t cell) {
  std::string p = cell_trace_path(dir, cell);
  return p.replace(p.size() - 3, 3, ".log");
}

std::vector<size_t> listed_cells(const std::string& dir) {
  std::vector<size_t> cells;
  std::ifstream in(dir + "/cells.tsv");
  std::string line;
  std::getline(in, line);  // header: cell, overrides
  while (std::getline(in, line)) {
    size_t cell = 0;
    const char* end = line.data() + line.size();
    const auto [after, error] = std::from_chars(line.data(), end, cell);
    if (error == std::errc() && after != end && *after == '\t') cells.push_back(cell);
  }
  return cells;
}

}  // namespace divlab
