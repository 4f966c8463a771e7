// The layout of a sweep folder, written by `divlab sweep` and read by `analyze` and `bisect`:
// cells/NNNN.h5 and cells/NNNN.log for cell N, and cells.tsv, the grid's cells in order.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace divlab {

// DIR/cells/NNNN.h5 for cell i.
std::string cell_trace_path(const std::string& dir, size_t cell);
// DIR/cells/NNNN.log: the cell's stdout and stderr.
std::string cell_log_path(const std::string& dir, size_t cell);
// The cells DIR/cells.tsv lists (every cell of the grid, started or not); empty without it.
std::vector<size_t> listed_cells(const std::string& dir);

}  // namespace divlab
