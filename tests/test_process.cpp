// common/process.h: one way to start a child, which never outlives the thread that started it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/process.h"
#include "tests/support/fixtures.h"

namespace divlab {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Whether `pid` is still a live process: neither gone nor a zombie waiting for its new parent
// to reap it.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Whether `pid` is still alive 10 s on (then killed, so no test leaves it behind).
bool outlives(pid_t pid) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (alive(pid) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const bool outlived = alive(pid);
  if (outlived) kill(pid, SIGKILL);
  return outlived;
}

TEST(Process, RunsFromPathWithItsArgumentsUnquotedAndItsEnvironmentReplaced) {
  const std::string dir = testing::temp_dir("process");
  const std::string log = dir + "/it's a log";
  SpawnOptions so;
  so.log = log;
  so.setenv = {"HOME=/nowhere 'quoted'"};
  const int status = run_process(
      {"sh", "-c", "echo \"$1|$HOME\"; echo oops >&2; exit 3", "sh", "a b; $(false)"}, so);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(read_all(log), "a b; $(false)|/nowhere 'quoted'\noops\n");
  std::filesystem::remove_all(dir);
}

// A command line divlab prints for a person to paste (check's replay lines) or writes into a
// script (Slurm's): every word a shell reads back as it was, whatever it holds; plain words stay
// bare so the line reads as typed. Fresh random words each run, the seed printed on failure.
TEST(Process, AShellWordIsReadBackAsItWas) {
  EXPECT_EQ(shell_word("add=reference"), "add=reference");
  EXPECT_EQ(shell_word("/a/b-c_d.so"), "/a/b-c_d.so");
  EXPECT_EQ(shell_word("values NaN"), "'values NaN'");
  EXPECT_EQ(shell_word(""), "''");
  EXPECT_EQ(shell_word("=ls"), "'=ls'");  // zsh would expand it to ls's path
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 gen(seed);
  const std::string alphabet = "ab9 '\"\\$`!*?[]{}()<>|&;#~=%,:@+-_./\t\n";
  const std::string dir = testing::temp_dir("shell_word");
  for (int k = 0; k < 40; ++k) {
    std::string word;
    const size_t length = std::uniform_int_distribution<size_t>(0, 12)(gen);
    for (size_t i = 0; i < length; ++i)
      word += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(gen)];
    SpawnOptions so;
    so.log = dir + "/out";
    ASSERT_EQ(run_process({"sh", "-c", "printf '%s|' " + shell_word(word)}, so), 0)
        << "seed " << seed << ", word " << shell_word(word);
    EXPECT_EQ(read_all(so.log), word + "|") << "seed " << seed << ", word " << shell_word(word);
  }
  std::filesystem::remove_all(dir);
}

// Every command words a child's end alike (a check's crashed condition, a sanitizer that ended
// without its summary, a rank that took the others down).
TEST(Process, AnEndIsNamedByItsExitCodeOrItsSignal) {
  EXPECT_EQ(describe_wait_status(run_process({"sh", "-c", "exit 3"})), "exit code 3");
  EXPECT_EQ(describe_wait_status(run_process({"sh", "-c", "kill -9 $$"})), "SIGKILL (Killed)");
  EXPECT_EQ(describe_wait_status(run_process({"sh", "-c", "kill -11 $$"})),
            "SIGSEGV (Segmentation fault)");
  EXPECT_EQ(describe_wait_status(run_process({"divlab-no-such-program"})), "not started");
}

// A deadline (check's sanitizer pass: a kernel that hangs only under the tool) kills the child
// and says so; a child that ends in time is waited for as without one.
TEST(Process, AChildPastItsDeadlineIsKilledAndSaidToBe) {
  bool timed_out = false;
  const auto start = std::chrono::steady_clock::now();
  const int killed = run_process({"sleep", "30"}, {}, 0.3, &timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(timed_out);
  ASSERT_TRUE(WIFSIGNALED(killed));
  EXPECT_EQ(WTERMSIG(killed), SIGKILL);
  // In a group of its own, what it started is killed with it.
  const std::string dir = testing::temp_dir("deadline");
  SpawnOptions own;
  own.own_process_group = true;
  run_process({"sh", "-c", "sleep 30 & echo $! > '" + dir + "/pid'; wait"}, own, 0.5, &timed_out);
  EXPECT_TRUE(timed_out);
  pid_t grandchild = 0;
  std::ifstream(dir + "/pid") >> grandchild;
  ASSERT_GT(grandchild, 0);
  EXPECT_FALSE(outlives(grandchild)) << "what the child started (pid " << grandchild << ")";
  const int done = run_process({"sh", "-c", "exit 4"}, {}, 30, &timed_out);
  EXPECT_FALSE(timed_out);
  ASSERT_TRUE(WIFEXITED(done));
  EXPECT_EQ(WEXITSTATUS(done), 4);
}

TEST(Process, AProgramThatCannotStartIsMinusOneNotAChild) {
  EXPECT_EQ(spawn_process({"divlab-no-such-program"}), -1);
  EXPECT_EQ(spawn_process({"/nonexistent/divlab"}), -1);
  EXPECT_EQ(spawn_process({"/etc/hostname"}), -1);  // not executable
  EXPECT_EQ(run_process({}), -1);
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);  // no child was left behind to reap
}

TEST(Process, AChildDiesWithItsParentKilledBySigkill) {
  // A middle process starts `sleep` and reports its pid; SIGKILL to the middle process must take
  // the sleep with it (PR_SET_PDEATHSIG), as a killed `divlab analyze` takes its plot script.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    const pid_t child = spawn_process({"sleep", "60"});
    [[maybe_unused]] const ssize_t n = write(fds[1], &child, sizeof child);
    pause();
    _exit(0);
  }
  close(fds[1]);
  pid_t child = -1;
  ASSERT_EQ(read(fds[0], &child, sizeof child), ssize_t(sizeof child));
  close(fds[0]);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(alive(child));
  kill(middle, SIGKILL);
  ASSERT_EQ(waitpid(middle, nullptr, 0), middle);
  EXPECT_FALSE(outlives(child)) << "sleep (pid " << child << ") outlived its killed parent";
}

// In a tool's child: the target a tool starts, which asks to die with `asking`, writes its pid
// to `report` and waits to be killed.
[[noreturn]] void be_the_target(pid_t asking, int report) {
  setenv(kDieWithStarter, std::to_string(asking).c_str(), 1);
  die_with_starter_if_asked();
  const pid_t self = getpid();
  [[maybe_unused]] const ssize_t n = write(report, &self, sizeof self);
  pause();
  _exit(0);
}

// The check's compute-sanitizer pass starts compute-sanitizer, which starts the checked divlab:
// that divlab is the tool's child, beyond spawn_process's tie. Asked to (kDieWithStarter), it dies
// when the tool is killed, and at once where the divlab that asked is already gone.
TEST(Process, AProcessAToolStartsForUsDiesWithTheToolWhenAsked) {
  const pid_t starter = getpid();
  // `tool` forks the target, which asks, reports its pid and waits; returns the target's pid.
  auto start = [](pid_t asking, int fds[2]) {
    const pid_t tool = fork();
    if (tool == 0) {
      if (fork() == 0) be_the_target(asking, fds[1]);
      pause();
      _exit(0);
    }
    return tool;
  };
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t tool = start(starter, fds);
  ASSERT_GT(tool, 0);
  pid_t target = -1;
  ASSERT_EQ(read(fds[0], &target, sizeof target), ssize_t(sizeof target));
  ASSERT_GT(target, 0);
  EXPECT_TRUE(alive(target));
  EXPECT_EQ(getenv(kDieWithStarter), nullptr) << "the test process's own environment";
  kill(tool, SIGKILL);
  ASSERT_EQ(waitpid(tool, nullptr, 0), tool);
  EXPECT_FALSE(outlives(target)) << "the target (pid " << target << ") outlived its killed tool";

  // A starter already gone: the target never gets as far as reporting.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  const pid_t late = fork();
  if (late == 0) {
    setenv(kDieWithStarter, std::to_string(gone).c_str(), 1);
    die_with_starter_if_asked();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(late, &status, 0), late);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL);
  close(fds[0]), close(fds[1]);
}

// compute-sanitizer outlives the starter's SIGTERM (it waits for its target), so the target
// watches the starter itself: killing the starting divlab ends the target, then the tool.
TEST(Process, AProcessAToolStartsForUsDiesWithTheStarterWhileTheToolLivesOn) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t starter = fork();
  if (starter == 0) {
    const pid_t asking = getpid();
    if (fork() == 0) {  // the tool: deaf to SIGTERM, waits for its target
      signal(SIGTERM, SIG_IGN);
      const pid_t target = fork();
      if (target == 0) be_the_target(asking, fds[1]);
      waitpid(target, nullptr, 0);
      _exit(0);
    }
    pause();
    _exit(0);
  }
  ASSERT_GT(starter, 0);
  pid_t target = -1;
  ASSERT_EQ(read(fds[0], &target, sizeof target), ssize_t(sizeof target));
  ASSERT_GT(target, 0);
  EXPECT_TRUE(alive(target));
  kill(starter, SIGKILL);
  ASSERT_EQ(waitpid(starter, nullptr, 0), starter);
  EXPECT_FALSE(outlives(target)) << "the target (pid " << target << ") outlived its starter";
  close(fds[0]), close(fds[1]);
}

// run_forked: what the function returns comes back, however large; what ends its process (an
// exit() inside a library, an exception, a signal) is told apart, with what it wrote to stderr;
// none of the parent's exit handlers runs in the child.
TEST(Process, AForkedFunctionReturnsOrEndsItsOwnProcessAlone) {
  static pid_t owner = 0;
  static std::string marker;
  owner = getpid();
  marker = testing::temp_dir("forked") + "/a parent's exit handler ran in the child";
  static const bool registered = [] {
    return std::atexit([] {
             if (getpid() != owner) std::ofstream(marker) << "ran\n";
           }) == 0;
  }();
  ASSERT_TRUE(registered);

  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char(i * 131 % 251);
  ForkedRun r = run_forked([&] {
    std::fputs("said on stderr\n", stderr);
    return big;
  });
  EXPECT_TRUE(r.returned);
  EXPECT_EQ(r.output, big);
  EXPECT_EQ(r.log, "said on stderr\n");

  r = run_forked([]() -> std::string {
    std::fputs("a library's check failed\n", stderr);
    std::exit(-1);
  });
  EXPECT_FALSE(r.returned);
  EXPECT_EQ(r.killed_by, 0);
  EXPECT_EQ(r.stopped_by, 0);
  EXPECT_EQ(r.log, "a library's check failed\n");
  EXPECT_FALSE(std::filesystem::exists(marker));

  r = run_forked([]() -> std::string { throw std::runtime_error("out of the function"); });
  EXPECT_FALSE(r.returned);
  EXPECT_EQ(r.killed_by, 0);

  r = run_forked([]() -> std::string {
    raise(SIGKILL);
    return "";
  });
  EXPECT_FALSE(r.returned);
  EXPECT_EQ(r.killed_by, SIGKILL);

  // Asked to stop: the child is killed and reaped at once, long before it would have ended.
  int polls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  r = run_forked(
      [] {
        std::this_thread::sleep_for(std::chrono::seconds(30));
        return std::string("too late");
      },
      [&] { return ++polls == 5 ? SIGTERM : 0; });
  EXPECT_EQ(r.stopped_by, SIGTERM);
  EXPECT_FALSE(r.returned);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
}

}  // namespace
}  // namespace divlab
