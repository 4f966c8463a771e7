// One HDF5 file per run (layout: docs/trace-format.md).
//
// Crash safety comes from HDF5's SWMR mode: every object is created first, then SWMR writing
// starts, after which the writer only appends to 1-D series and overwrites fixed-size arrays.
// Appends are buffered and written in blocks at each flush; a killed writer leaves a file that
// SWMR readers (h5py: File(path, "r", swmr=True)) read up to the last flush.
//
// Before SWMR writing starts, a file is not readable (no superblock yet, or one flagged as open
// for ordinary writing), so it is laid out under PATH.partial and renamed to PATH by publish():
// a kill at any instant leaves PATH either absent, as it was before (--force, --resume), or
// readable. finish() records the outcome without leaving SWMR writing for the same reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/named_enum.h"

namespace H5 {
class PredType;
}

namespace divlab {

// A run's state, as its trace's root attribute "status" records it (by name_of):
// running until the run ends, then completed (every step it was asked for), nan (stopped on a
// non-finite loss or gradient: a finding), interrupted (SIGINT or SIGTERM: resumable) or failed
// (a kernel threw or the process crashed: the root attribute "failure" says how).
enum class RunStatus { Running, Completed, Nan, Interrupted, Failed };
template <>
struct EnumNames<RunStatus> {
  static constexpr std::pair<RunStatus, const char*> table[] = {
      {RunStatus::Running, "running"},
      {RunStatus::Completed, "completed"},
      {RunStatus::Nan, "nan"},
      {RunStatus::Interrupted, "interrupted"},
      {RunStatus::Failed, "failed"}};
};

// Writing the trace failed mid-run (disk full, the file or its folder no longer writable). What
// was flushed before stays readable.
struct TraceWriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class TraceWriter {
 public:
  // Creates PATH.partial (the caller holds the trace's writer lock, so a leftover one is a dead
  // writer's and is truncated); throws InputError if PATH exists and not `overwrite`, or if the
  // file cannot be created. Destroyed before publish(), it removes PATH.partial again.
  TraceWriter(const std::string& path, bool overwrite);
  // A writer that keeps nothing: every call below is accepted and dropped (the data-parallel
  // ranks other than rank 0, which run the same code and leave the trace to rank 0).
  TraceWriter();
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // --- Before start(): layout. Paths are absolute ("/metrics/loss"); groups are made as needed.
  void attr(const std::string& object, const std::string& name, const std::string& value);
  void attr(const std::string& object, const std::string& name, double value);
  void attr(const std::string& object, const std::string& name, int64_t value);
  // Root "status": running until finish() records the outcome.
  void status_attr(RunStatus status);
  enum class Kind { Float64, Int64 };
  void series(const std::string& path, Kind kind);  // extendible 1-D, chunked along steps
  // Makes `series` the one every flush writes last. A writer killed during a flush then leaves
  // it no longer than any other series: readers count complete entries by its length.
  void commit_series(const std::string& series);
  void array(const std::string& path, Kind kind, int64_t size);  // fixed-size 1-D, zeros
  // Fixed-size N-D (row-major), zeros: weight matrices as PyTorch shapes them.
  void array(const std::string& path, Kind kind, const std::vector<int64_t>& shape);
  void bytes(const std::string& path, const std::string& data);  // opaque blob (uint8[])
  // Starts SWMR writing; no objects can be created after this.
  void start();
  // Flushes and renames PATH.partial to PATH (atomically replacing an older trace): after
  // start() for a trace, or at the end for a file written whole without SWMR.
  void publish();

  // --- After start().
  void append(const std::string& series, double value);
  void append(const std::string& series, int64_t value);
  void write_array(const std::string& path, const std::vector<double>& values);
  void write_array(const std::string& path, const std::vector<int64_t>& values);
  // Writes buffered appends when `steps_since_flush` or the wall-clock interval is due.
  void maybe_flush(int64_t flush_steps, double flush_seconds);
  void flush();
  // Flushes, closes, and records the final status, with any further root attributes (string
  // values).
  void finish(RunStatus status, const std::vector<std::pair<std::string, std::string>>& attrs = {});

  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;          // where the trace is published
  std::string partial_path_;  // where it is written until then
  bool published_ = false;
  bool write_failed_ = false;
  std::string commit_series_;
  int64_t reserved_ = 0;  // bytes allocated on disk for the file (posix_fallocate)
  // Makes sure the disk holds room for `bytes` more than HDF5's current end of file, plus
  // headroom, before anything is written: a full disk then stops the run between two consistent
  // states instead of leaving HDF5 with a half-written file.
  void reserve(int64_t bytes);
  std::chrono::steady_clock::time_point last_flush_;
  [[noreturn]] void write_failed(const char* what);
  void flush_series();
  void write_array(const std::string& path, const void* values, int64_t count,
                   const H5::PredType& type);
};

// For the supervisor of a writer that died of a crash (a fatal signal), holding the trace's writer
// lock after it: records status "failed" and the root attribute "failure" in the trace the writer
// left, keeping every step it flushed. HDF5 leaves such a file flagged as open for SWMR writing;
// it is opened past that flag as h5clear does, and closed cleanly. Changes nothing and returns
// false unless PATH is a published trace still "running" (no PATH.partial beside it: a crash
// before publishing leaves PATH as it was, maybe another run's).
bool record_crash(const std::string& path, const std::string& failure);
// record_crash by a process that does not hold the writer lock (a supervisor, a sweep whose
// cell it killed): it takes the lock first, waiting up to `wait_seconds` for a dying writer to
// let go of it. A lock still held then is another writer's, who owns the trace: nothing is
// recorded. Once recorded, the dead writer's lock file goes.
bool record_crash_after_writer(const std::string& path, const std::string& failure,
                               double wait_seconds);

// Read access (SWMR read, so a trace still being written, or left by a killed run, opens too).
class TraceReader {
 public:
  explicit TraceReader(const std::string& path);  // throws InputError if not a readable trace
  ~TraceReader();
  bool exists(const std::string& path) const;
  bool has_attr(const std::string& object, const std::string& name) const;
  std::string string_attr(const std::string& object, const std::string& name) const;
  double number_attr(const std::string& object, const std::string& name) const;
  // The root "status"; throws InputError when the attribute is missing or holds a word no
  // divlab writes.
  RunStatus status() const;
  std::vector<double> floats(const std::string& dataset) const;
  std::vector<int64_t> ints(const std::string& dataset) const;
  std::vector<double> tensor(const std::string& dataset) const;  // any rank, row-major
  std::string blob(const std::string& dataset) const;
  std::vector<std::string> children(const std::string& group) const;
  bool is_group(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace divlab
