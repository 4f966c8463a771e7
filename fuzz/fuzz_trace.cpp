// libFuzzer target: the trace reader, as analyze, resume and bisect use it. The input is written
// to a file and read as a trace: any input must be read or refused with InputError; any other
// exception, crash or sanitizer report is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "experiments/config.h"
#include "io/checkpoint.h"
#include "io/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/divlab-fuzz-trace-" + std::to_string(getpid()) + ".h5";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
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
