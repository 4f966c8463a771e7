// Shadow mode's replays: a recorded call run again with some kernel set (a candidate on the run's
// backend, or the fp64 CPU reference), and the comparison of a candidate's outputs with the
// reference's. Used by kernels/shadow.cpp only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/op_spec.h"
#include "kernels/shadow.h"

namespace divlab::shadow_detail {

// Items moved into a vector: captures' input arrays, replays' outputs. (A braced list would copy
// each array, element by element, at once: before a queued download has filled it, while its
// block goes back to the pool with the download still writing into it.)
template <class Item, class... Items>
std::vector<Item> moved_list(Items&&... items) {
  std::vector<Item> v;
  v.reserve(sizeof...(Items));
  (v.push_back(std::forward<Items>(items)), ...);
  return v;
}

// One output of a replay, in the storage it was computed in (widened only where compared): in
// staging memory (Output) or, with a DeviceComparison, on the device (DeviceOutput).
template <class Values>
struct OutputOf {
  Values values;
  int64_t rows, cols;
  RowKey key;
};
using Output = OutputOf<StagedArray>;
using DeviceOutput = OutputOf<DeviceArray>;

// The recorded call `c` (of a run storing T and A) of `op`, run with kernel set `k` (storing U
// and UA: the run's own types for candidates, double for the fp64 reference) in a context from
// `contexts` carrying the call's own seed and stream. Inputs and
// outputs live in k's memory; outputs come back in staging blocks from `pool` (on a device:
// filled by queued downloads, readable once a fence behind them has passed).
template <class T, class A, class U, class UA>
std::vector<Output> replay(const std::string& op, const typename ShadowTap<T, A>::Capture& c,
                           const KernelSet<U, UA>& k, OpContextSource& contexts, StagingPool* pool);

// The recorded call `c` replayed on the device from its device copies (DeviceComparison): read
// in place where k stores what the run stored, widened where k stores fp32 and the run bf16;
// outputs in zeroed blocks of `pool`; everything queued on `stream`, with the call's seed.
template <class T, class A, class U, class UA>
std::vector<DeviceOutput> replay_on_device(const std::string& op,
                                           const typename ShadowTap<T, A>::Capture& c,
                                           const KernelSet<U, UA>& k, OpContextSource& contexts,
                                           StagingPool* pool, void* stream,
                                           const DeviceComparison& dev);

// One spec's metrics over every recorded call: candidate outputs against the reference's, rows
// bucketed by their token's count in the step (`id_count`, `batch`).
ShadowMetrics compare_outputs(const std::vector<std::vector<Output>>& candidate,
                              const std::vector<std::vector<Output>>& reference,
                              const std::vector<int64_t>& id_count, const TokenId* batch);

}  // namespace divlab::shadow_detail
