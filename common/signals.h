// Stopping cleanly. Once a command accepts stop requests, SIGINT, SIGTERM, SIGHUP and SIGPIPE
// only record one, which its long loops poll: a run finishes its step and records "interrupted"
// (resumable); a sweep asks its running cells to stop the same way, waits for them, and ends
// with StopRequested. main() installs the handlers before anything else and `train` accepts
// requests before it reads its config, so no early signal kills a run without that record.
// Commands that never poll (analyze, the kernel checks) keep the signals' usual effect.
// A child never outlives its parent, however the parent ends: common/process.h.
#pragma once

#include <stdexcept>
#include <string>

namespace divlab {

void install_stop_handlers();
void accept_stop_requests();  // from now on, for the rest of the process
int stop_signal();            // the first stop signal received, or 0
// Ends the process as `sig`'s usual effect would, for work that cannot stop at a step of its own
// (a library call that runs for minutes) and has written nothing yet.
[[noreturn]] void end_by_signal(int sig);

// Thrown by a loop that stopped on request, after leaving everything resumable; main() exits
// with 128 + signal.
struct StopRequested : std::runtime_error {
  explicit StopRequested(int sig)
      : std::runtime_error("stopped by signal " + std::to_string(sig)), signal(sig) {}
  int signal;
};

}  // namespace divlab
