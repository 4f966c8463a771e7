#include "common/paths.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace divlab {

namespace {

std::string find_resource_dir() {
  if (const char* home = std::getenv("DIVLAB_HOME"); home && *home) return home;
  std::error_code ec;
  const std::filesystem::path exe = self_exe();
  if (exe.has_parent_path()) {
    const auto share = exe.parent_path().parent_path() / "share" / "divlab";
    if (std::filesystem::is_directory(share / "configs", ec)) return share.lexically_normal();
  }
  return DIVLAB_SOURCE_DIR;
}

}  // namespace

std::string self_exe() {
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return "divlab";
  const std::string deleted = " (deleted)";
  if (exe.size() > deleted.size() &&
      exe.compare(exe.size() - deleted.size(), deleted.size(), deleted) == 0)
    exe.resize(exe.size() - deleted.size());
  return exe;
}

std::string self_exe_to_start() {
  const std::string own = "/proc/" + std::to_string(getpid()) + "/exe";
  return access(own.c_str(), X_OK) == 0 ? own : self_exe();
}

std::string resource_dir() {
  static const std::string dir = find_resource_dir();  // the process's answer, fixed once
  return dir;
}

std::string resource_path(const std::string& relative) {
  return resource_dir() + "/" + relative;
}

}  // namespace divlab
