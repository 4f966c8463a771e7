// Whole-file reads and atomic whole-file writes, for the small text files the tool keeps beside
// its traces (grids, manifests, tokenizer caches).
#pragma once

#include <string>
#include <vector>

namespace divlab {

// The file's bytes; false (and `out` empty) if it cannot be read.
bool read_file(const std::string& path, std::string& out);

// The whole of a file the user named as input; `what` names it in messages ("config file").
// Throws InputError "WHAT 'PATH': ..." when it is missing, is not a regular file (a named pipe
// or a device would block or never end, a folder holds no text) or cannot be read.
std::string read_input_file(const std::string& path, const std::string& what);

// What a file that is not a regular one is, for messages: "a folder", "a named pipe", "a device"
// or "a socket" (`mode` from stat).
std::string special_file_kind(unsigned mode);

// Checks that `path` names a regular file before anything opens it (opening a named pipe blocks
// until a writer comes; a device never ends). Throws InputError "WHAT 'PATH': no such file", "...
// a folder" + `folder_hint`, "... a named pipe" or "... a device" (not a file).
void require_input_file(const std::string& path, const std::string& what,
                        const std::string& folder_hint = "");

// Writes `bytes` to a temporary file beside `path` (named by the process id, so concurrent
// writers never share one) and renames it over `path`: readers see the old file or the new one,
// never a part. False, with nothing left behind, if the write fails.
bool write_file_atomically(const std::string& path, const std::string& bytes);
// write_file_atomically, or InputError "WHAT 'PATH': cannot be written (disk full, or the folder
// unwritable)": an output a command cannot write ends it, rather than leave a part of the file.
void write_output_file(const std::string& path, const std::string& bytes, const std::string& what);

// Where an output at `path` may be written: its folder, or the nearest folder above it that
// exists, under which the missing ones can be made. Throws InputError "WHAT 'PATH': ..." naming
// the nearest existing one when it is not a folder or not writable.
void check_output_folder(const std::string& path, const std::string& what);

// The folders on the way to an output that do not exist yet (runs/ in a fresh checkout), made
// as `mkdir -p` would, once the command's checks have passed; those still empty when this object
// goes are removed again (deepest first), so a command stopped before it wrote anything leaves no
// folder behind. Throws InputError "WHAT 'PATH': cannot make folder ..." when one cannot be made.
class MadeFolders {
 public:
  MadeFolders(const std::string& path, const std::string& what);
  ~MadeFolders();
  MadeFolders(const MadeFolders&) = delete;
  MadeFolders& operator=(const MadeFolders&) = delete;

 private:
  std::vector<std::string> made_;  // outermost first
};

// A file with no name in any folder (memfd_create), for what a parent and its child process
// exchange: nothing of it outlives both, however either ends (SIGKILL included). path() names it
// for this process and the children it starts (/dev/fd/N; the descriptor is inherited). Throws
// std::runtime_error where the system has none.
class UnnamedFile {
 public:
  explicit UnnamedFile(const char* what);
  ~UnnamedFile();
  UnnamedFile(const UnnamedFile&) = delete;
  UnnamedFile& operator=(const UnnamedFile&) = delete;
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  void clear() const;  // truncated to nothing

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace divlab
