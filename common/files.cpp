#include "common/files.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/errors.h"

namespace divlab {

bool read_file(const std::string& path, std::string& out) {
  out.clear();
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  out = s.str();
  return bool(in) || in.eof();
}

namespace {
// The folders an output at `path` goes into that have no entry yet, innermost first, and the
// nearest one that has (maybe not a folder: a file, a dangling link); "." for a bare name.
std::vector<std::filesystem::path> missing_folders(const std::string& path,
                                                   std::filesystem::path* nearest) {
  namespace fs = std::filesystem;
  std::vector<fs::path> missing;
  fs::path dir = fs::path(path).parent_path();
  std::error_code ec;
  while (!dir.empty() && fs::symlink_status(dir, ec).type() == fs::file_type::not_found) {
    missing.push_back(dir);
    const fs::path up = dir.parent_path();
    if (up == dir) break;  // a root that does not exist
    dir = up;
  }
  *nearest = dir.empty() ? fs::path(".") : dir;
  return missing;
}
}  // namespace

void check_output_folder(const std::string& path, const std::string& what) {
  std::filesystem::path dir;
  missing_folders(path, &dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError(what + " '" + path + "': '" + dir.string() + "' is not a folder");
  if (access(dir.c_str(), W_OK) != 0)
    throw InputError(what + " '" + path + "': folder '" + dir.string() + "' is not writable");
}

MadeFolders::MadeFolders(const std::string& path, const std::string& what) {
  std::filesystem::path nearest;
  const auto missing = missing_folders(path, &nearest);
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (mkdir(it->c_str(), 0755) == 0) {
      made_.push_back(it->string());
      continue;
    }
    if (errno == EEXIST) continue;  // made meanwhile by someone else: theirs
    const std::string why = std::strerror(errno);
    for (auto m = made_.rbegin(); m != made_.rend(); ++m) rmdir(m->c_str());
    throw InputError(what + " '" + path + "': cannot make folder '" + it->string() + "' (" + why +
                     ")");
  }
}

MadeFolders::~MadeFolders() {
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) rmdir(it->c_str());  // only if empty
}

std::string read_input_file(const std::string& path, const std::string& what) {
  require_input_file(path, what, ", not a file");
  std::string text;
  if (!read_file(path, text)) throw InputError(what + " '" + path + "': cannot be read");
  return text;
}

void require_input_file(const std::string& path, const std::string& what,
                        const std::string& folder_hint) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw InputError(what + " '" + path + "': " +
                     (errno == ENOENT ? std::string("no such file") : std::strerror(errno)));
  if (S_ISREG(st.st_mode)) return;
  throw InputError(what + " '" + path + "': " + special_file_kind(st.st_mode) +
                   (S_ISDIR(st.st_mode) ? folder_hint : ", not a file"));
}

std::string special_file_kind(unsigned mode) {
  return S_ISDIR(mode)                    ? "a folder"
         : S_ISFIFO(mode)                 ? "a named pipe"
         : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
                                          : "a socket";
}

bool write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    if (!out) {
      unlink(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

void write_output_file(const std::string& path, const std::string& bytes, const std::string& what) {
  if (!write_file_atomically(path, bytes))
    throw InputError(what + " '" + path +
                     "': cannot be written (disk full, or the folder "
                     "unwritable)");
}

UnnamedFile::UnnamedFile(const char* what) {
  // Without MFD_CLOEXEC: a child started from here opens it by path() after its exec.
  fd_ = memfd_create(what, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
  path_ = "/dev/fd/" + std::to_string(fd_);
}

UnnamedFile::~UnnamedFile() {
  close(fd_);
}

void UnnamedFile::clear() const {
  if (ftruncate(fd_, 0) != 0)
    throw std::runtime_error("ftruncate: " + std::string(std::strerror(errno)));
}

}  // namespace divlab
