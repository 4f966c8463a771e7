#include "common/fault.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

namespace divlab {

void fault_point(const char* name) {
  const char* spec = std::getenv("DIVLAB_FAULT");
  if (spec == nullptr) return;
  const char* colon = std::strchr(spec, ':');
  const std::string point = colon ? std::string(spec, colon) : std::string(spec);
  if (point != name) return;
  const long nth = colon ? std::strtol(colon + 1, nullptr, 10) : 1;
  // One point is armed per process, so one counter serves; the process ends when it fires.
  static long reached = 0;
  if (++reached == nth) std::raise(SIGKILL);
}

}  // namespace divlab
