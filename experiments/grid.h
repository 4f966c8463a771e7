// Experiment grids: a TOML file naming a base config, fixed overrides and axes.
//
//   config = "../configs/tiny.toml"     # optional, relative to the grid file
//   [set]                                # every cell: any config key
//   data = "zipf:1.1"
//   [set.train]
//   steps = 200
//   [axes]                               # the Cartesian product of all axes, in file order
//   data = ["uniform", "zipf:1.1"]
//   [axes.kernels]
//   embed_rmsnorm_backward = ["reference", "bf16_accum", "fp32_reordered"]
//   [axes.train]
//   seed = [0, 1, 2]
//   optimizer = ["sgd", "adamw train.lr=3e-3"]  # a value may bring overrides of its own
//                                        # (two axes' values bringing one key: the later axis wins;
//                                        # an axis's own key: refused, the label would mislead)
//   [quick.set.train]                    # optional: what --quick changes (set and axes)
//   steps = 50
//
// Slurm resources for `sweep --emit-slurm` may live in the grid (the command line overrides):
//   [slurm]
//   time = "02:00:00"        # --time
//   mem = "8G"               # --mem
//   partition = "gpu"        # --partition
//   account = "lab"          # --account
//   gpus_per_task = 1        # --gpus-per-task
//   cpus_per_task = 4        # --cpus-per-task (default 2; cells use that many threads)
//   setup = "module load cuda; source ~/venv/bin/activate"   # run before divlab
//
// A grid that is not one product names parts: each [parts.NAME.set...] / [parts.NAME.axes...]
// table is a product of its own over the grid's [set] and [axes] (a part's keys override the
// grid's), and the cells are the parts' cells in file order, e.g. real text at three batches
// beside iid tokens at one:
//   [parts.dose.axes.train]
//   batch = [64, 256, 1024]
//   [parts.uniform.set]
//   data = "uniform"
//   [parts.uniform.set.train]
//   batch = 256
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace divlab {

// The most cells one grid may have: checking cells' configs took 0.56 s for 10 000 (2-core VM),
// and a grid of 40 million (two long axes) grew past 10 GB within three minutes, before it ran
// anything.
constexpr size_t kMaxGridCells = 100000;

struct Grid {
  std::string path;                // the grid file
  std::string base_config;         // resolved path, or empty
  std::string base_config_text;    // its content as read once (hashed into id, frozen by sweep)
  std::vector<std::string> fixed;  // "key=value" for every cell
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;  // key -> values
  // Cell i's overrides (fixed, then one value per axis; the last axis varies fastest).
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> labels;  // per cell: its axis values (and what they brought along)
  std::string id;                   // sha256 of the base config's text and every cell's overrides
  std::map<std::string, std::string> slurm;  // [slurm] key -> value text (not part of the id)
  int64_t first_cuda_cell = -1;              // the first cell with backend = "cuda", if any
  std::vector<int64_t> host_bytes;  // per cell: the host memory its run predicts (0 on cuda)

  size_t size() const { return cells.size(); }
  const std::string& describe(size_t cell) const { return labels.at(cell); }
};

// Parses and validates (every cell's config must load). `quick` applies the [quick] overlay;
// `seed_offset` moves every cell's train.seed by that much (a re-run with fresh seeds);
// `base_config`, when given, replaces the grid's `config` path (a sweep folder's frozen copy).
// Throws InputError naming the grid file, key or cell.
Grid load_grid(const std::string& path, bool quick = false, uint64_t seed_offset = 0,
               const std::string& base_config = "");

}  // namespace divlab
