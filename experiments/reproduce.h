// `divlab reproduce`: the reported failure as an experiment (grid -> sweep -> analyze -> matrix).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/verdicts.h"
#include "kernels/backend.h"

namespace divlab {

struct ReproduceOptions {
  Backend backend = Backend::Cpu;  // cuda: the real-text grid for one GPU (reproduce-gpu.toml)
  std::string grid;  // default: configs/reproduce.toml (cpu) or configs/reproduce-gpu.toml
  std::string out;   // default: runs/reproduce[-gpu][-quick]
  bool quick = false;
  int jobs = 0;
  bool plots = true;
  uint64_t seed_offset = 0;  // fresh seeds: every cell's train.seed moved by this much
};

// Runs the grid, analyses it, prints the matrix; returns the verdicts.
std::vector<Verdict> run_reproduce(const ReproduceOptions& opt);

}  // namespace divlab
