// Shadow mode's replays: a recorded call run again with some kernel set (a candidate on the run's
// backend, or the fp64 CPU reference), and the comparison of a candidate's outputs with the
// reference's. Used by kernels/shadow.cpp only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

// How an output's rows map to the batch's tokens, for the frequency buckets.
enum class RowKey { Position, TokenId, None };
// One output of a replay, in the precision it was computed in (widened only where compared).
template <class U>
struct Output {
  Staged<U> values;
  int64_t rows, cols;
  RowKey key;
};

// The recorded call `c` of `op` run with kernel set `k` in precision U. Inputs and outputs live in
// k's memory; outputs come back in staging blocks from `pool` (on a device: filled by queued
// downloads, readable once a fence behind them has passed).
template <class T, class U>
std::vector<Output<U>> replay(const std::string& op, const typename ShadowTap<T>::Capture& c,
                              const KernelSet<U>& k, StagingPool* pool);

// One spec's metrics over every recorded call: candidate outputs against the reference's, rows
// bucketed by their token's count in the step (`id_count`, `batch`).
template <class U>
ShadowMetrics compare_outputs(const std::vector<std::vector<Output<U>>>& candidate,
                              const std::vector<std::vector<Output<double>>>& reference,
                              const std::vector<int64_t>& id_count, const TokenId* batch);

}  // namespace divlab::shadow_detail
