// `divlab sweep`: every cell of a grid as its own `divlab train` process, N at a time.
#pragma once

#include <cstdint>
#include <string>

#include "analysis/analyze.h"

namespace divlab {

// --emit-slurm's resources: a value given here overrides the grid's [slurm] one; unset ones
// are left to the cluster's defaults (cpus_per_task: 2).
struct SlurmResources {
  std::string time, mem, partition, account, setup;
  int gpus_per_task = -1, cpus_per_task = -1;  // -1: unset
};

struct SweepOptions {
  std::string grid;  // empty: the grid frozen in `out` by an earlier sweep (job-array tasks)
  std::string out;
  int jobs = 0;              // 0: number of cores
  int cell = -1;             // >= 0: run only this cell, in this process (job arrays)
  bool quick = false;        // apply the grid's [quick] overlay
  uint64_t seed_offset = 0;  // every cell's train.seed moved by this much (fresh seeds)
  double timeout_s = 0;      // per cell; 0: none
  // Asked to stop, seconds a running cell has to finish its step and record "interrupted"
  // before it is killed (a batch system's own kill follows its SIGTERM: SLURM's KillWait, 30 s
  // by default, wants less than this default).
  double stop_grace_s = 60;
  double memory_gib = 0;  // host memory the cells may hold together; 0: what is available
  bool emit_slurm = false;
  SlurmResources slurm;
  bool verbose = true;
};

struct SweepSummary {
  int cells = 0, skipped = 0, completed = 0, nan = 0, failed = 0;
};

// Throws InputError for a bad grid or an output directory that holds another grid's cells, and
// StopRequested (signals.h) after stopping its cells when asked to stop.
SweepSummary run_sweep(const SweepOptions& opt);

// How every command analyses a sweep folder `dir`: kernel roles from the traces, and for traces
// that do not record them the CPU catalogue's answer.
AnalyzeOptions analyze_options(const std::string& dir);

}  // namespace divlab
