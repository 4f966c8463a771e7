#include "common/files.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

std::string read_input_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw InputError(what + " '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw InputError(what + " '" + path + "': is not a regular file" +
                     (S_ISDIR(st.st_mode) ? " (a folder)" : ""));
  std::string text;
  if (!read_file(path, text)) throw InputError(what + " '" + path + "': cannot be read");
  return text;
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
