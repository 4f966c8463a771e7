// Checkpoints inside the trace, and what --resume reads back.
//
// Two slots (/checkpoint/0 and /checkpoint/1) are written alternately. Each has a marker,
// `next_step`, that is zeroed and flushed before the slot's data is overwritten and set (then
// flushed) only after: a process killed at any moment leaves at least one slot whose marker
// matches its data. Batches are a pure function of (seed, step), so the state is the weights,
// the optimizer moments, the step, the token counts so far and the kernels' call counter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/trace.h"

namespace divlab {

struct Checkpoint {
  int64_t next_step = 0;  // the first step not yet taken
  std::vector<double> params, first_moment, second_moment;
  std::vector<int64_t> token_counts;
};

// Creates both slots (before SWMR starts).
void lay_out_checkpoints(TraceWriter& w, int64_t params, bool second_moment, int vocab);
// The slot of the checkpoint taken before step `next_step`: consecutive checkpoints alternate.
inline int checkpoint_slot(int64_t next_step, int64_t every) {
  return int((next_step / every) % 2);
}
// Writes `c` into `slot` (0 or 1) with the marker protocol above; also flushes every series.
void write_checkpoint(TraceWriter& w, const Checkpoint& c, int slot);
// The newest consistent checkpoint; none if the run stopped before its first (or never takes one).
std::optional<Checkpoint> read_checkpoint(const TraceReader& r);

// Every series of a trace (under /metrics, /eval, /shadow), truncated to the entries of steps
// before `next_step`, in file order: (dataset path, values).
std::vector<std::pair<std::string, std::vector<double>>> read_history(const TraceReader& r,
                                                                      int64_t next_step);

}  // namespace divlab
