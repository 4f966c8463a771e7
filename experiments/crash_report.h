// A run's last words. While a CrashReport is alive, a fatal signal (SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, SIGABRT) first writes one line to stderr naming the op the run was in, its variant and
// the step, then the process dies of the same signal as before (so its exit status, a sweep's
// "crashed (signal N)" and the resumable trace are unchanged; a sweep copies the line from the
// cell's log into its manifest). The handler does nothing else: a kernel that wrote out of bounds
// may have corrupted the heap, and HDF5 is not async-signal-safe, so the trace is not touched and
// keeps every step before the crash with status "running". A call to exit() while a report is
// alive (a plug-in ending the process) is reported the same way and ends the process with code 1
// at once. Only write(2) runs in the handler:
// every text is formatted when the report is made. Under `divlab train`'s supervisor
// (experiments/supervise.h) the line also goes down a pipe, and the supervisor, once this process
// is dead, marks the trace "failed" with it.
//
// A fatal signal's handler is process-wide by nature: one report is active at a time (a second
// made while one is alive reports nothing by signal, but still describes()).
#pragma once

#include <csignal>
#include <string>
#include <utility>
#include <vector>

#include "kernels/op_tracker.h"

namespace divlab {

class CrashReport {
 public:
  // `variants[op]`: the variant the run calls for op `op` (an Op's index), with its plug-in;
  // `shadowed[i]`: shadow.variants entry i as {op, variant with its plug-in} (OpNote::shadow).
  CrashReport(const OpNote& note, const std::vector<std::string>& variants,
              const std::vector<std::pair<std::string, std::string>>& shadowed = {});
  ~CrashReport();  // puts the previous handlers back
  CrashReport(const CrashReport&) = delete;
  CrashReport& operator=(const CrashReport&) = delete;

  // Where the run is, e.g. "in op add (variant segfaults_on_large) at step 3", "in op add
  // (variant V, replayed by shadow mode) at step 3" or "at step 3, outside any op (the last one
  // entered: add)".
  std::string where() const;
  // The prefix a sweep looks for in a cell's log.
  static constexpr const char* kPrefix = "divlab: crashed: ";

  void write_line(int signal) const;  // async-signal-safe; signal 0: exit() called in the run
  // Whether `signal` is one of the fatal signals a report writes its line for.
  static bool is_fatal(int signal);
  // Also writes the line to `fd` (the pipe to the process supervising this one; -1: none).
  static void copy_to(int fd);

 private:
  const OpNote& note_;
  std::vector<std::string> inside_, after_;  // per op: " in op X (variant V)", the other case
  std::vector<std::string> shadowed_;        // per shadow.variants entry, as inside_
  bool installed_ = false;
  std::vector<std::pair<int, struct sigaction>> saved_;  // the handlers it replaced
};

}  // namespace divlab
