// Per-op wall time of a real training step: wraps every op of a KernelSet so that each call is
// timed between two backend synchronisations. For finding where a step's time goes (and what a
// candidate kernel costs inside real training); the synchronisations add launch latency, so
// compare ops with each other, not with an unprofiled step.
#pragma once

#include <map>
#include <string>

#include "kernels/registry.h"

namespace divlab {

struct OpTime {
  double seconds = 0;
  int64_t calls = 0;
};

template <class T, class A = T>
class OpProfiler {
 public:
  // Any number of profilers may coexist: each wrapper is bound to its own (Kernel::state).
  explicit OpProfiler(const KernelSet<T, A>& inner);
  OpProfiler(const OpProfiler&) = delete;  // the wrappers point at this object
  OpProfiler& operator=(const OpProfiler&) = delete;
  const KernelSet<T, A>& kernels() const { return timed_; }
  const std::map<std::string, OpTime>& times() const { return times_; }
  void reset() { times_.clear(); }

  // Used by the timing wrappers.
  const KernelSet<T, A>& inner() const { return inner_; }
  void add(const char* op, double seconds) {
    OpTime& t = times_[op];
    t.seconds += seconds, ++t.calls;
  }

 private:
  KernelSet<T, A> inner_, timed_;
  ReferencePairs<T, A> timed_pairs_;  // the inner set's pairs, timed (where it runs them)
  std::map<std::string, OpTime> times_;
};

}  // namespace divlab
