// Fault injection for the crash-safety tests: DIVLAB_FAULT=NAME[:N] kills the process with
// SIGKILL the N-th time (default the first) it reaches the fault point NAME. A kill at a random
// instant hits a window of a few microseconds only by chance; a named point hits it every time.
//
// Points: trace.before_publish, trace.between_flushes, trace.finishing, checkpoint.marked,
// checkpoint.filled (see where each is called). Unset, a fault point costs one getenv.
#pragma once

namespace divlab {

void fault_point(const char* name);

}  // namespace divlab
