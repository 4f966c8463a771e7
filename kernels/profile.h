// Per-op device time of a real training step: wraps every op of a KernelSet so that each call
// is bracketed by two timing marks on its stream (CUDA events; host clock readings on the CPU).
// Nothing waits between calls, so the step is queued as it is unprofiled and each op's time is
// what the device spent from its first launch to its last completion, gaps between its own
// launches included; where the host falls behind the device (small models), an op's time also
// holds the wait for its launches. For finding where a step's time goes and what a candidate
// kernel costs inside real training.
#pragma once

#include <map>
#include <string>
#include <vector>

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
  ~OpProfiler();
  const KernelSet<T, A>& kernels() const { return timed_; }
  // The calls timed so far (waits for the last of them to finish).
  const std::map<std::string, OpTime>& times();
  void reset();  // forgets every call so far, finished or not

  // Used by the timing wrappers: a call of `op` between two marks of inner().memory.
  const KernelSet<T, A>& inner() const { return inner_; }
  void add(const char* op, void* first_mark, void* later_mark);

 private:
  struct Pending {
    const char* op;
    void* first;
    void* later;
  };
  void resolve();          // reads every pending call's time, then releases its marks
  void release_pending();  // releases the pending calls' marks unread

  KernelSet<T, A> inner_, timed_;
  ReferencePairs<T, A> timed_pairs_;  // the inner set's pairs, timed (where it runs them)
  std::map<std::string, OpTime> times_;
  std::vector<Pending> pending_;  // marked calls not yet read
};

}  // namespace divlab
