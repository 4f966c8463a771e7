// Starting child processes: one way for the whole project, from an argument vector and never
// through a shell, so no argument needs quoting (a folder named "it's" is just a name).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace divlab {

struct SpawnOptions {
  std::string log;                  // stdout and stderr to this file (truncated); empty: ours
  bool own_process_group = false;   // a terminal's Ctrl-C then reaches the parent alone
  std::vector<std::string> setenv;  // "NAME=value", replacing NAME in the inherited environment
};

// Starts argv[0] (a path, or looked up on PATH when it holds no '/'; self_exe(), divlab itself,
// starts this very build: self_exe_to_start() in common/paths.h); the child's pid, or -1
// when it could not be started (not found, not executable, or this process's end already
// under way). The child gets SIGTERM from the kernel when the thread that started it ends,
// however it ends (SIGKILL included, PR_SET_PDEATHSIG): a plot script, a sanitizer, a sweep's
// cell or a rank never outlives the command. So start children from a thread that outlives them
// (every caller does so from the main thread).
pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& opt = {});

// Runs argv to its end: its wait status (WIFEXITED / WEXITSTATUS apply), or -1 when it could
// not be started. With `seconds` > 0, a child still running that long after its start is killed
// (SIGKILL; with own_process_group, its whole group: what it started too) and `*timed_out` set;
// its wait status is then the kill's.
int run_process(const std::vector<std::string>& argv, const SpawnOptions& opt = {},
                double seconds = 0, bool* timed_out = nullptr);

// How a function run by run_forked ended: it returned, or was killed, or was stopped; or else
// it ended its process itself (an exit() call, an exception out of it), which `log` may explain.
struct ForkedRun {
  bool returned = false;  // and `output` is what it returned
  int killed_by = 0;      // the signal that killed the child, if one did
  int stopped_by = 0;     // the nonzero `stop()` answer on which the child was killed
  std::string output;
  std::string log;  // what the child wrote to stderr
};

// Runs `work` in a forked copy of this process, for library code that may end its process (an
// internal check that calls exit()): what it returns comes back in `output`, its stderr in `log`.
// An exit() in the child ends it at once, running none of this process's exit handlers (the CUDA
// runtime's teardown of a context the child must not touch, static destructors, a second flush
// of buffered output). The child dies with the calling thread (PR_SET_PDEATHSIG), and is killed
// when `stop()`, asked every 20 ms while it runs, answers nonzero (a signal number, say). Only
// for work that starts no CUDA and needs nothing another thread of this process held at the fork.
ForkedRun run_forked(
    const std::function<std::string()>& work, const std::function<int()>& stop = [] { return 0; });

// How a process ended, from its wait status: "exit code 3", "SIGKILL (Killed)", or "not
// started" for run_process's -1.
std::string describe_wait_status(int status);

// Whether `program` names an executable file on PATH.
bool on_path(const std::string& program);

// `s` as one word a POSIX shell reads back unchanged, for command lines divlab prints or writes
// for a person or a script (a replay line, a Slurm script): as it is where it holds only
// characters no shell treats specially, else in single quotes (a quote inside as '\'').
std::string shell_word(const std::string& s);

// A divlab started by another tool that divlab started (the check's compute-sanitizer pass runs
// divlab under compute-sanitizer) is the tool's child, not ours, so spawn_process's tie does not
// reach it. The starting divlab puts kDieWithStarter=<its pid> in the tool's environment
// (die_with_starter_env), and the divlab the tool starts calls die_with_starter_if_asked()
// first thing: it is killed when the tool ends or when the divlab that asked ends (the tool may
// outlive it), and ends at once if that divlab is already gone. Without the variable, nothing
// happens (a check run by hand under nohup lives on); a value that is no PID is an InputError.
inline constexpr const char* kDieWithStarter = "DIVLAB_DIE_WITH_STARTER";
std::string die_with_starter_env();
void die_with_starter_if_asked();

}  // namespace divlab
