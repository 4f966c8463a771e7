#include "experiments/supervise.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "common/lock.h"
#include "experiments/crash_report.h"
#include "io/trace.h"

namespace divlab {

namespace {
volatile std::sig_atomic_t g_child = 0;

extern "C" void forward_to_child(int sig) {
  if (g_child > 0) kill(pid_t(g_child), sig);
}

// What the child's crash report wrote down the pipe: "crashed: " and where (without
// "divlab: " and the newline), or "" if it wrote nothing.
std::string crash_line(int fd) {
  fcntl(fd, F_SETFL, O_NONBLOCK);  // a grandchild may hold the other end: read what is there
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  const std::string prefix = CrashReport::kPrefix;
  if (text.rfind(prefix, 0) != 0) return "";
  if (const auto end = text.find('\n'); end != std::string::npos) text.erase(end);
  return "crashed: " + text.substr(prefix.size());
}

// Marks a trace whose writer died "failed" with `failure` (a trace already finished, or not
// there, is left as it is).
void record_in_trace(const std::string& trace, const std::string& failure) {
  // The child's lock died with it (waited for: it is dead); another writer holding it now owns
  // the trace.
  if (record_crash_after_writer(trace, failure, 0))
    std::cerr << "divlab: the trace '" << trace << "' records it: status failed, " << failure
              << std::endl;
}

[[noreturn]] void die_of(int sig) {
  const struct rlimit no_core { 0, 0 };  // the child's core, if any, is the one worth keeping
  setrlimit(RLIMIT_CORE, &no_core);
  std::fflush(nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  sigprocmask(SIG_UNBLOCK, &only, nullptr);
  raise(sig);
  _exit(128 + sig);
}
}  // namespace

void run_supervised(const std::string& trace) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return;
  std::cout.flush(), std::cerr.flush(), std::fflush(nullptr);  // nothing is written twice
  // A run ended by a signal (a stop while the tokenizer trains, which cannot stop part-way,
  // ends it so) or a crash leaves the lock file it created, which goes once the run is dead; one
  // that was there before stays, as every refused command leaves it.
  const std::string lock = trace.empty() ? "" : trace + ".lock";
  const bool lock_was_there = !lock.empty() && access(lock.c_str(), F_OK) == 0;
  auto remove_its_lock = [&] {
    if (!lock.empty() && !lock_was_there) remove_dead_writers_lock(lock);
  };
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]), close(pipe_fds[1]);
    return;
  }
  if (pid == 0) {
    close(pipe_fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL);  // the parent died before the call above
    CrashReport::copy_to(pipe_fds[1]);
    name_writer_as(parent);  // a refused second writer is told the command's PID
    return;
  }
  close(pipe_fds[1]);
  g_child = pid;
  struct sigaction forward {};
  forward.sa_handler = forward_to_child;
  forward.sa_flags = SA_RESTART;
  sigemptyset(&forward.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &forward, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) _exit(1);
  if (WIFEXITED(status)) {
    // Exited inside the run (exit() in a kernel): the crash report's line came down the pipe.
    if (const std::string failure = crash_line(pipe_fds[0]); !failure.empty() && !trace.empty())
      record_in_trace(trace, failure);
    remove_its_lock();
    std::fflush(nullptr);
    _exit(WEXITSTATUS(status));
  }
  const int sig = WTERMSIG(status);
  if (CrashReport::is_fatal(sig) && !trace.empty()) {
    const std::string failure = crash_line(pipe_fds[0]);
    record_in_trace(trace, failure.empty() ? "crashed: signal " + std::to_string(sig) +
                                                 " before the run's first op"
                                           : failure);
  }
  remove_its_lock();
  die_of(sig);
}

}  // namespace divlab
