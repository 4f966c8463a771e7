// Stopping cleanly. Once a command accepts stop requests, SIGINT, SIGTERM, SIGHUP and SIGPIPE
// only record one, which its long loops poll: a run finishes its step and records "interrupted"
// (resumable); a sweep asks its running cells to stop the same way, waits for them, and ends
// with StopRequested. main() installs the handlers before anything else and `train` accepts
// requests before it reads its config, so no early signal kills a run without that record.
// Commands that never poll (analyze, the kernel checks) keep the signals' usual effect.
//
// A cell started by a sweep must not outlive it, however the sweep ends (SIGKILL included):
// the sweep names itself in DIVLAB_PARENT_PID, and the cell asks the kernel for SIGTERM when
// that parent dies (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <stdexcept>
#include <string>

namespace divlab {

constexpr const char* kParentPidVariable = "DIVLAB_PARENT_PID";

void install_stop_handlers();
void accept_stop_requests();  // from now on, for the rest of the process
int stop_signal();            // the first stop signal received, or 0

// Thrown by a loop that stopped on request, after leaving everything resumable; main() exits
// with 128 + signal.
struct StopRequested : std::runtime_error {
  explicit StopRequested(int sig)
      : std::runtime_error("stopped by signal " + std::to_string(sig)), signal(sig) {}
  int signal;
};

// In a child: arranges SIGTERM on the death of the parent named in DIVLAB_PARENT_PID, and
// records a stop request at once if that parent is already gone. No-op when it is unset.
void stop_with_parent();

}  // namespace divlab
