// Which op a run is inside, so that a kernel that throws or crashes can be named: every op of a
// KernelSet wrapped so that it records the op on entry and clears the mark on return. The record
// is lock-free atomics, which a fatal-signal handler may read (experiments/crash_report.h).
// On a device, a launch returns before its kernel runs: a fault there surfaces at a later
// synchronisation, in whatever op or copy makes it (debug.sync_kernels makes it the launching op).
#pragma once

#include <atomic>
#include <cstdint>

#include "kernels/registry.h"

namespace divlab {

struct OpNote {
  std::atomic<int> op{-1};          // the op last entered (an Op), -1 before any
  std::atomic<bool> inside{false};  // from its entry until it returns
  std::atomic<int64_t> step{-1};    // the caller's step (the trainer sets it)
  // While shadow mode replays a candidate on a step's recorded inputs: the index of its
  // shadow.variants entry (ShadowTap::name_replays_in), else -1.
  std::atomic<int> shadow{-1};
  static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);
};

template <class T, class A = T>
class OpTracker {
 public:
  // Each wrapper is bound to its tracker (Kernel::state): any number may coexist.
  OpTracker(const KernelSet<T, A>& inner, OpNote& note);
  OpTracker(const OpTracker&) = delete;  // the wrappers point at this object
  OpTracker& operator=(const OpTracker&) = delete;
  const KernelSet<T, A>& kernels() const { return tracked_; }

  // Used by the wrappers.
  const KernelSet<T, A>& inner() const { return inner_; }
  OpNote& note() const { return note_; }

 private:
  KernelSet<T, A> inner_, tracked_;
  ReferencePairs<T, A> tracked_pairs_;  // the inner set's pairs, tracked (where it runs them)
  OpNote& note_;
};

}  // namespace divlab
