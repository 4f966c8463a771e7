// libFuzzer target: the trace reader, as analyze, resume and bisect use it. The input is written
// to an in-memory file and read as a trace: any input must be read or refused with InputError; any
// other exception, crash or sanitizer report is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "experiments/config.h"
#include "io/checkpoint.h"
#include "io/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // In memory, opened by its /dev/fd path: a file in /tmp per fuzzing process was left behind.
  static const int fd = memfd_create("divlab-fuzz-trace", 0);
  static const std::string path = "/dev/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 ||
      (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)))
    return 0;
  try {
    const divlab::TraceReader r(path);
    (void)r.status();
    if (r.exists("/metrics/loss")) (void)r.floats("/metrics/loss");
    if (r.exists("/metrics/step")) (void)r.ints("/metrics/step");
    for (const auto& child : r.children("/")) (void)r.is_group("/" + child);
    if (const auto c = divlab::read_checkpoint(r)) (void)divlab::read_history(r, c->next_step);
  } catch (const divlab::InputError&) {
  }
  return 0;
}
