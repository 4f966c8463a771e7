// `divlab train` under a supervisor: the command forks once, the child runs the training, the
// parent waits for it and exits as it did. A kernel that kills the process (a segfault, an
// abort) cannot record anything itself (its heap may be corrupt, and HDF5 is not
// async-signal-safe), so the parent does it once the child is dead: it takes the trace's writer
// lock, marks the trace "failed" with the crash report's line naming the op, variant and step
// (io/trace.h's record_crash), and then dies of the same signal, so a sweep still sees
// "crashed (signal N)".
//
// The child dies with its parent (PR_SET_PDEATHSIG, SIGKILL): killing the command's process kills
// the run as it always did. SIGINT, SIGTERM and SIGHUP sent to the parent reach the child, which
// stops after its step as before (signals.h).
#pragma once

#include <string>

namespace divlab {

// Returns in the child, which carries on with the command. In the parent it does not return: it
// exits with the child's exit status, or dies of the child's signal after recording a crash in
// `trace`. Where no child can be started, it returns in the only process, unsupervised.
void run_supervised(const std::string& trace);

}  // namespace divlab
