// The trace writer from the C++ side: series appended in blocks, read back while open (SWMR),
// status rewritten at the end. The user-side layout check (h5py) is tests/py/test_cli.py.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "experiments/config.h"
#include "io/trace.h"
#include "tests/support/check.h"

namespace divlab {

TEST(Trace, AppendFlushReadWhileOpenThenFinish) {
  const std::string path = "/tmp/divlab_trace_test_" + std::to_string(getpid()) + ".h5";
  unlink(path.c_str());
  {
    TraceWriter w(path, false);
    w.attr("/", "backend", std::string("cpu"));
    w.status_attr(RunStatus::Running);
    w.series("/metrics/loss", TraceWriter::Kind::Float64);
    w.series("/metrics/step", TraceWriter::Kind::Int64);
    w.array("/dataset/token_counts", TraceWriter::Kind::Int64, 5);
    w.start();
    EXPECT_NE(access(path.c_str(), F_OK), 0);  // laid out under PATH.partial until published
    w.publish();
    EXPECT_NE(access((path + ".partial").c_str(), F_OK), 0);
    for (int64_t s = 0; s < 25; ++s) {
      w.append("/metrics/step", s);
      w.append("/metrics/loss", 1.0 / (s + 1));
      w.maybe_flush(10, 1e9);
    }
    {
      TraceReader r(path);  // while the writer holds it: 20 steps flushed, 5 pending
      EXPECT_EQ(r.ints("/metrics/step").size(), 20u);
      EXPECT_EQ(r.string_attr("/", "status"), "running");
      EXPECT_EQ(r.status(), RunStatus::Running);
    }
    w.write_array("/dataset/token_counts", std::vector<int64_t>{1, 2, 3, 4, 5});
    w.finish(RunStatus::Completed);
  }
  TraceReader r(path);
  EXPECT_EQ(r.string_attr("/", "status"), "completed");
  EXPECT_EQ(r.status(), RunStatus::Completed);
  EXPECT_EQ(r.string_attr("/", "backend"), "cpu");
  const auto loss = r.floats("/metrics/loss");
  ASSERT_EQ(loss.size(), 25u);
  EXPECT_DOUBLE_EQ(loss[24], 1.0 / 25);
  EXPECT_EQ(r.ints("/dataset/token_counts"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  unlink(path.c_str());
}

TEST(Trace, AStatusNoDivlabWritesIsRefusedNamingIt) {
  const std::string path = "/tmp/divlab_trace_status_" + std::to_string(getpid()) + ".h5";
  {
    TraceWriter w(path, true);
    w.attr("/", "status", std::string("finished"));  // another tool's word
    w.start();
    w.publish();
  }
  const TraceReader r(path);
  try {
    (void)r.status();
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    const std::string said = e.what();
    EXPECT_NE(said.find("status 'finished' is none divlab writes"), std::string::npos) << said;
    EXPECT_NE(said.find(path), std::string::npos) << said;
  }
  unlink(path.c_str());
}

namespace {
// A published trace with nothing in it, left "running" (its writer gone without finish()).
void leave_running_trace(const std::string& path) {
  TraceWriter w(path, true);
  w.status_attr(RunStatus::Running);
  w.start();
  w.publish();
}
}  // namespace

TEST(Trace, RefusesToOverwriteWithoutPermission) {
  const std::string path = "/tmp/divlab_trace_exists_" + std::to_string(getpid()) + ".h5";
  leave_running_trace(path);
  EXPECT_THROW(TraceWriter(path, false), InputError);
  unlink(path.c_str());
}

TEST(Trace, AWriterGoneBeforePublishingLeavesNothing) {
  // Bad input found while the trace is laid out: nothing may be created, and an older trace
  // that --force would replace stays as it was.
  const std::string path = "/tmp/divlab_trace_unpublished_" + std::to_string(getpid()) + ".h5";
  unlink(path.c_str());
  {
    TraceWriter w(path, true);
    w.status_attr(RunStatus::Running);
    w.series("/metrics/step", TraceWriter::Kind::Int64);
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_NE(access((path + ".partial").c_str(), F_OK), 0);
}

// A writer that dies mid-run (here: _exit in a forked child, no finish, no destructor) leaves
// its file flagged as open for SWMR writing; record_crash marks it "failed" with the failure and
// keeps the flushed steps, and touches nothing that is not a published, running trace.
TEST(Trace, ACrashedWritersTraceIsMarkedFailedOnce) {
  const std::string path = "/tmp/divlab_trace_crashed_" + std::to_string(getpid()) + ".h5";
  unlink(path.c_str());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    TraceWriter w(path, true);
    w.status_attr(RunStatus::Running);
    w.series("/metrics/step", TraceWriter::Kind::Int64);
    w.start();
    w.publish();
    for (int64_t s = 0; s < 13; ++s) {
      w.append("/metrics/step", s);
      w.maybe_flush(10, 1e9);
    }
    _exit(0);  // as a crash would: 10 steps flushed, 3 pending
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(TraceReader(path).string_attr("/", "status"), "running");
  ASSERT_TRUE(record_crash(path, "crashed: SIGSEGV in op add at step 12"));
  {
    const TraceReader r(path);
    EXPECT_EQ(r.string_attr("/", "status"), "failed");
    EXPECT_EQ(r.string_attr("/", "failure"), "crashed: SIGSEGV in op add at step 12");
    EXPECT_EQ(r.ints("/metrics/step").size(), 10u);
  }
  EXPECT_FALSE(record_crash(path, "again"));  // no longer running
  EXPECT_EQ(TraceReader(path).string_attr("/", "failure"), "crashed: SIGSEGV in op add at step 12");
  EXPECT_FALSE(record_crash(path + ".absent", "x"));
  unlink(path.c_str());
}

TEST(Trace, ACrashBeforePublishingLeavesTheOlderTraceAlone) {
  const std::string path = "/tmp/divlab_trace_older_" + std::to_string(getpid()) + ".h5";
  leave_running_trace(path);  // an older run's, killed
  const std::string partial = path + ".partial";
  FILE* f = std::fopen(partial.c_str(), "w");  // the crashed run's own, never published
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_FALSE(record_crash(path, "crashed: SIGSEGV"));
  EXPECT_EQ(TraceReader(path).string_attr("/", "status"), "running");
  unlink(partial.c_str());
  unlink(path.c_str());
}

TEST(Trace, ReaderRejectsGarbage) {
  const std::string path = "/tmp/divlab_trace_garbage_" + std::to_string(getpid()) + ".h5";
  FILE* f = fopen(path.c_str(), "w");
  fputs("not hdf5 at all", f);
  fclose(f);
  EXPECT_THROW(TraceReader r(path), InputError);
  unlink(path.c_str());
}
}  // namespace divlab
