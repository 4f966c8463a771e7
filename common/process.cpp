#include "common/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string_view>
#include <thread>

#include "common/errors.h"
#include "common/files.h"
#include "common/paths.h"

extern char** environ;

namespace divlab {

namespace {

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The first executable `program` on PATH, or "".
std::string find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0)
      return dir + "/" + program;
  return "";
}

// Returns once process `pid` (not our child) has ended: woken by its pidfd where the kernel has
// them (Linux 5.3), else by looking twice a second.
void wait_for_end_of(pid_t pid) {
  const int fd = int(syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    pollfd ended{fd, POLLIN, 0};
    while (poll(&ended, 1, -1) < 0 && errno == EINTR) {
    }
    close(fd);
    return;
  }
  while (kill(pid, 0) == 0 || errno != ESRCH)
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

}  // namespace

pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& opt) {
  if (argv.empty()) return -1;
  // Everything the child needs is built here: between fork and exec only system calls are safe
  // (another thread may hold the allocator's lock at the fork).
  std::string program = argv[0];
  // divlab starting itself starts this very build, even after a rebuild replaced the file at its
  // path (a sweep's cells, a check's worker, a run's ranks: never two builds under one label).
  if (program == self_exe()) program = self_exe_to_start();
  if (program.find('/') == std::string::npos) program = find_on_path(program);
  if (program.empty()) return -1;
  std::vector<std::string> args = argv, env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& s : opt.setenv)
      replaced |= entry.compare(0, s.find('=') + 1, s, 0, s.find('=') + 1) == 0;
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), opt.setenv.begin(), opt.setenv.end());
  std::vector<char*> arg_ptrs = pointers(args), env_ptrs = pointers(env);
  // The child reports a failed exec's errno on this pipe; a successful exec closes it unwritten.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return -1;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Dies with the thread that started it, however this process ends (SIGKILL included):
    // SIGTERM, which a divlab child answers by finishing its step and recording "interrupted".
    // A parent already gone before the request was made sends nothing, so look.
    int error = 0;
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) error = ESRCH;
    if (error == 0 && opt.own_process_group && setpgid(0, 0) != 0) error = errno;
    if (error == 0 && !opt.log.empty()) {
      const int fd = open(opt.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) error = errno;
      if (fd > 2) close(fd);
    }
    if (error == 0) {
      execve(program.c_str(), arg_ptrs.data(), env_ptrs.data());
      error = errno;
    }
    [[maybe_unused]] const ssize_t written = write(report[1], &error, sizeof error);
    _exit(127);
  }
  close(report[1]);
  int error = pid < 0 ? errno : 0;
  if (pid > 0) {
    ssize_t n;
    while ((n = read(report[0], &error, sizeof error)) < 0 && errno == EINTR) {
    }
    if (n != ssize_t(sizeof error)) error = 0;
  }
  close(report[0]);
  if (pid > 0 && error != 0) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return -1;
  }
  return pid;
}

int run_process(const std::vector<std::string>& argv, const SpawnOptions& opt, double seconds,
                bool* timed_out) {
  if (timed_out) *timed_out = false;
  const pid_t pid = spawn_process(argv, opt);
  if (pid < 0) return -1;
  int status = 0;
  if (seconds > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (true) {
      const pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) return status;
      if (done < 0 && errno != EINTR) return -1;
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // In a group of its own, what it started goes too (a tool's launcher and its target).
    kill(opt.own_process_group ? -pid : pid, SIGKILL);
    if (timed_out) *timed_out = true;
  }
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

ForkedRun run_forked(const std::function<std::string()>& work, const std::function<int()>& stop) {
  const UnnamedFile result("divlab-forked-output"), log("divlab-forked-log");
  const pid_t parent = getpid();
  std::cout.flush(), std::fflush(stdout), std::fflush(stderr);  // or the child writes them again
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    // Handlers run last-registered first: an exit() in the child runs this one, and no other.
    std::atexit([] { _exit(1); });
    dup2(log.fd(), 2);
    std::string output;
    try {
      output = work();
    } catch (...) {
      _exit(1);
    }
    for (size_t done = 0; done < output.size();) {
      const ssize_t n = write(result.fd(), output.data() + done, output.size() - done);
      if (n <= 0) _exit(1);
      done += size_t(n);
    }
    _exit(0);  // the one way to 0
  }
  ForkedRun r;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if ((r.stopped_by = stop()) != 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  read_file(log.path(), r.log);
  if (WIFSIGNALED(status)) r.killed_by = WTERMSIG(status);
  r.returned = WIFEXITED(status) && WEXITSTATUS(status) == 0 && read_file(result.path(), r.output);
  return r;
}

std::string describe_wait_status(int status) {
  if (status == -1) return "not started";
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  const char* name = sigabbrev_np(sig);
  return std::string(name ? std::string("SIG") + name : "signal " + std::to_string(sig)) + " (" +
         strsignal(sig) + ")";
}

bool on_path(const std::string& program) {
  return !find_on_path(program).empty();
}

std::string shell_word(const std::string& s) {
  // (A leading '=' is zsh's command-path expansion.)
  const bool plain = !s.empty() && s[0] != '=' && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("_-+./:=@%,").find(c) != std::string_view::npos;
  });
  if (plain) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string die_with_starter_env() {
  return std::string(kDieWithStarter) + "=" + std::to_string(getpid());
}

void die_with_starter_if_asked() {
  const char* value = std::getenv(kDieWithStarter);
  if (!value) return;
  char* end = nullptr;
  errno = 0;
  const long starter = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || errno != 0 || starter <= 0 || pid_t(starter) != starter)
    throw InputError(std::string("environment variable ") + kDieWithStarter + "='" + value +
                     "': expected the PID of the divlab that started this one's tool (divlab "
                     "sets it; unset it to run divlab by hand)");
  unsetenv(kDieWithStarter);  // for this process, not for whatever it starts
  // SIGKILL: such a process (a check in one process) has nothing to leave behind. A tool or a
  // starter already gone before the request was made sends nothing, so look.
  const pid_t tool = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != tool ||
      (kill(pid_t(starter), 0) != 0 && errno == ESRCH))
    _exit(128 + SIGKILL);
  // The tool need not end with the starter: compute-sanitizer, sent SIGTERM by the starter's
  // death (spawn_process), waits on for its target. So the target watches the starter too.
  std::thread([starter = pid_t(starter)] {
    wait_for_end_of(starter);
    _exit(128 + SIGKILL);
  }).detach();
}

}  // namespace divlab
