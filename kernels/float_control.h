// The calling thread's floating-point control state (rounding, flush-to-zero, trapped exceptions),
// and the guard around every plug-in kernel call: a kernel that changes it and returns leaves
// every op after it in the process computing differently (a CPU kernel that turns on
// flush-to-zero for speed, or sets a rounding direction and forgets it), which its own outputs,
// judged alone, do not show.
#pragma once

#include <cstdint>
#include <string>

namespace divlab {

// The control bits only: the sticky exception flags, which any arithmetic sets, are left out.
struct FloatControl {
  uint32_t sse = 0;  // x86-64: MXCSR without its flags
  uint16_t x87 = 0;  // x86-64: the x87 control word
  int rounding = 0;  // elsewhere: fegetround()
  bool operator==(const FloatControl& o) const {
    return sse == o.sse && x87 == o.x87 && rounding == o.rounding;
  }
  bool operator!=(const FloatControl& o) const { return !(*this == o); }
};

FloatControl float_control();
void restore_float_control(const FloatControl& c);
// What differs, in words: "rounding toward +inf (SSE), flush-to-zero on".
std::string float_control_change(const FloatControl& before, const FloatControl& after);

// `change` is float_control_change's wording.
[[noreturn]] void throw_float_control_changed(const std::string& change);

// Calls `call` (plug-in code: a kernel, a library's constructors) and puts the control state back
// as it found it, also when `call` throws; returns what `call` had changed, "" if nothing.
template <class F>
std::string call_restoring_float_control(F&& call) {
  const FloatControl before = float_control();
  try {
    call();
  } catch (...) {
    restore_float_control(before);
    throw;
  }
  const FloatControl after = float_control();
  if (after == before) return "";
  restore_float_control(before);
  return float_control_change(before, after);
}

// Calls `call` (a plug-in kernel); if it leaves the control state changed, restores it and throws
// std::runtime_error saying what changed.
template <class F>
void call_keeping_float_control(F&& call) {
  if (const std::string change = call_restoring_float_control(call); !change.empty())
    throw_float_control_changed(change);
}

}  // namespace divlab
