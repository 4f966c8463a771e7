#include "common/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

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

}  // namespace

pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& opt) {
  if (argv.empty()) return -1;
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
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!opt.log.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, opt.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (opt.own_process_group) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  pid_t pid = -1;
  const bool search = argv[0].find('/') == std::string::npos;
  const int rc = search
                     ? posix_spawnp(&pid, arg_ptrs[0], &fa, &attr, arg_ptrs.data(), env_ptrs.data())
                     : posix_spawn(&pid, arg_ptrs[0], &fa, &attr, arg_ptrs.data(), env_ptrs.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

int run_process(const std::vector<std::string>& argv, const SpawnOptions& opt) {
  const pid_t pid = spawn_process(argv, opt);
  if (pid < 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace divlab
