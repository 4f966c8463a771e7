#include "common/lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/errors.h"

namespace divlab {

namespace {
struct flock whole_file(short type) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 0;  // to the end, however long
  return l;
}

pid_t holder_of(int fd) {
  struct flock l = whole_file(F_WRLCK);
  if (fcntl(fd, F_GETLK, &l) != 0 || l.l_type == F_UNLCK) return 0;
  return l.l_pid;
}

pid_t g_named_pid = 0;  // set once, before any lock (name_writer_as)

// The PID the holder wrote into the file, or `holder` where it wrote none (yet).
pid_t named_in(int fd, pid_t holder) {
  char text[24] = {};
  const ssize_t n = pread(fd, text, sizeof text - 1, 0);
  const long pid = n > 0 ? std::strtol(text, nullptr, 10) : 0;
  return pid > 0 ? pid_t(pid) : holder;
}
}  // namespace

void name_writer_as(pid_t pid) {
  g_named_pid = pid;
}

WriterLock::WriterLock(const std::string& path, const std::string& what) : path_(path) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const bool existed = access(path.c_str(), F_OK) == 0;
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      throw InputError(what + ": cannot create its lock file '" + path +
                       "': " + std::strerror(errno));
    struct flock l = whole_file(F_WRLCK);
    if (fcntl(fd, F_SETLK, &l) != 0) {
      const int err = errno;
      const pid_t pid = named_in(fd, holder_of(fd));
      close(fd);
      if (!existed) unlink(path.c_str());  // created by this refused call: leave nothing behind
      if (err == EACCES || err == EAGAIN)
        throw InputError(what + ": another divlab process (PID " + std::to_string(pid) +
                         ") is writing it; wait for it to end or stop it first");
      throw InputError(what + ": cannot lock '" + path + "': " + std::strerror(err));
    }
    // Locked: but if the holder before us removed the file between our open and our lock, we
    // hold a lock on a file no one else can find. Only the file at the path counts.
    struct stat mine {
    }, named{};
    if (fstat(fd, &mine) == 0 && stat(path.c_str(), &named) == 0 && mine.st_ino == named.st_ino &&
        mine.st_dev == named.st_dev) {
      fd_ = fd;
      remove_ = !existed;
      const std::string pid = std::to_string(g_named_pid > 0 ? g_named_pid : getpid()) + "\n";
      if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
        // The PID is a courtesy for a refused writer; the lock itself holds.
      }
      return;
    }
    close(fd);
  }
  throw InputError(what + ": its lock file '" + path +
                   "' keeps changing; is something removing it?");
}

WriterLock::~WriterLock() {
  if (fd_ < 0) return;
  if (remove_) unlink(path_.c_str());  // while still locked: a waiter retries on a new file
  close(fd_);
}

void remove_dead_writers_lock(const std::string& path) {
  if (access(path.c_str(), F_OK) != 0) return;
  try {
    WriterLock lock(path, "lock '" + path + "'");
    lock.done();
  } catch (const InputError&) {  // held: another writer's now
  }
}

pid_t lock_holder(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const pid_t pid = holder_of(fd);
  close(fd);
  return pid;
}

}  // namespace divlab
