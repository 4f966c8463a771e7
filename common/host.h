// Where and when something ran: recorded in traces and printed in reports (bitwise determinism
// is promised per machine and build).
#pragma once

#include <string>

namespace divlab {

std::string utc_now();    // 2026-11-24T08:30:00Z
std::string hostname();   // gethostname()
std::string cpu_model();  // /proc/cpuinfo's model name, or "unknown"

}  // namespace divlab
