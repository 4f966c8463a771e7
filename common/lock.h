// One writer per trace and per sweep folder: an exclusive lock held for the writer's lifetime.
//
// The lock is a POSIX record lock (fcntl F_SETLK) on a small file beside what it guards
// (`run.h5.lock`, `DIR/sweep.lock`), never on the HDF5 file itself: HDF5 opens and closes its own
// descriptors, and closing any descriptor of a file drops the process's record locks on it.
// The kernel releases the lock when the holder dies, whatever kills it, so a crashed writer
// never blocks the next one; a refused writer learns the holder's PID from F_GETLK. The holder
// removes the file when its work is done (or when it created the file and stops early), so a
// refused command leaves even a killed writer's file as it was; a process that locked a file
// which was removed meanwhile sees another inode at the path and tries again, so removal never
// lets two writers in.
#pragma once

#include <sys/types.h>

#include <string>

namespace divlab {

class WriterLock {
 public:
  // Takes the lock at `path` (creating the file), or throws InputError naming `what` and the
  // holder's PID when another process has it. Creates nothing when refused.
  WriterLock(const std::string& path, const std::string& what);
  ~WriterLock();
  // The guarded work is complete: the file goes on release even if an earlier writer left it.
  void done() { remove_ = true; }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
  bool remove_ = false;  // created here, or done()
};

// After the writer that locked `path` has died: the lock file it left (the holder removes it
// only when it ends on its own) goes. Nothing happens while another process holds the lock.
void remove_dead_writers_lock(const std::string& path);

// The PID holding the lock at `path`, or 0 when it is free (or the file does not exist).
pid_t lock_holder(const std::string& path);

// The PID a refused writer is told to wait for or stop: this process's own, unless it runs under
// a supervisor (experiments/supervise.h), whose PID is the command the user started. Each lock
// taken writes it into its file, and a refusal reads it back (or names the holder itself).
void name_writer_as(pid_t pid);

}  // namespace divlab
