#include "kernels/float_control.h"

#include <cfenv>
#include <stdexcept>
#include <vector>

namespace divlab {

namespace {
#if defined(__x86_64__)
constexpr uint32_t kSseFlags = 0x3f;  // MXCSR bits 0-5: the sticky exception flags

const char* rounding_name(unsigned bits) {  // the two-bit rounding field of MXCSR and x87
  static const char* const names[] = {"to nearest", "toward -inf", "toward +inf", "toward zero"};
  return names[bits & 3];
}
#endif
}  // namespace

FloatControl float_control() {
  FloatControl c;
#if defined(__x86_64__)
  uint32_t csr = 0;
  uint16_t cw = 0;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  __asm__ volatile("fnstcw %0" : "=m"(cw));
  c.sse = csr & ~kSseFlags, c.x87 = cw;
#else
  c.rounding = std::fegetround();
#endif
  return c;
}

void restore_float_control(const FloatControl& c) {
#if defined(__x86_64__)
  uint32_t csr = 0;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  csr = (csr & kSseFlags) | c.sse;
  uint16_t cw = c.x87;
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
  __asm__ volatile("fldcw %0" : : "m"(cw));
#else
  std::fesetround(c.rounding);
#endif
}

std::string float_control_change(const FloatControl& before, const FloatControl& after) {
  std::vector<std::string> parts;
#if defined(__x86_64__)
  const uint32_t sse = before.sse ^ after.sse;
  if (sse & 0x6000) parts.push_back(std::string("rounding ") + rounding_name(after.sse >> 13));
  if (sse & 0x8000) parts.push_back(after.sse & 0x8000 ? "flush-to-zero on" : "flush-to-zero off");
  if (sse & 0x40)
    parts.push_back(after.sse & 0x40 ? "denormals-are-zero on" : "denormals-are-zero off");
  if (sse & 0x1f80) parts.push_back("SSE exception traps changed");
  const unsigned x87 = before.x87 ^ after.x87;
  if (x87 & 0x0c00)
    parts.push_back(std::string("x87 rounding ") + rounding_name(unsigned(after.x87) >> 10));
  if (x87 & 0x0300) parts.push_back("x87 precision changed");
  if (x87 & 0x003f) parts.push_back("x87 exception traps changed");
  if (parts.empty()) parts.push_back("other control bits changed");
#else
  (void)before;
  parts.push_back("rounding mode " + std::to_string(after.rounding));
#endif
  std::string text;
  for (const auto& p : parts) text += (text.empty() ? "" : ", ") + p;
  return text;
}

void throw_float_control_changed(const std::string& change) {
  throw std::runtime_error(
      "a plug-in kernel returned with the thread's floating-point control changed (" + change +
      "): every op after it in the process would compute differently; a kernel restores what "
      "it sets (restored here)");
}

}  // namespace divlab
