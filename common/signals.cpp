#include "common/signals.h"

#include <csignal>
#include <initializer_list>

namespace divlab {

namespace {
// A signal handler can only reach globals; these two flags are all of the process's stop state.
volatile std::sig_atomic_t g_accepting = 0;
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop(int sig) {
  if (g_accepting == 0) {  // no loop polls: the signal's usual effect
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (g_stop_signal == 0) g_stop_signal = sig;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction stop {};
  stop.sa_handler = record_stop;
  stop.sa_flags = SA_RESTART;  // reads and waits carry on; the loops poll the flag
  sigemptyset(&stop.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(sig, &stop, nullptr);
}

void accept_stop_requests() {
  g_accepting = 1;
}

int stop_signal() {
  return int(g_stop_signal);
}

void end_by_signal(int sig) {
  std::signal(sig, SIG_DFL);
  std::raise(sig);
  std::_Exit(128 + sig);  // a signal whose usual effect is not to end the process
}

}  // namespace divlab
