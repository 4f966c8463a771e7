#include "kernels/guarded_workspace.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace divlab {

namespace {
constexpr unsigned char kGuardByte = 0xFF;  // all-ones: NaN as float, bf16 and double
constexpr size_t kAlign = 256;              // what the ABI promises a region's start
constexpr size_t kGuardBefore = 4096;
// After the region: at least 64 KiB, and seven times the region, so a kernel that sized its
// scratch in bytes where it writes floats (or doubles) still ends inside the guard.
constexpr size_t kMinGuardAfter = size_t(64) << 10, kMaxGuardAfter = size_t(256) << 20;
constexpr size_t kFillPiece = size_t(16) << 20;

size_t guard_after(size_t bytes) {
  return std::clamp(bytes * 7, kMinGuardAfter, kMaxGuardAfter);
}

std::string bytes_text(size_t n) {
  return std::to_string(n) + (n == 1 ? " byte" : " bytes");
}

// The byte range of `bytes` (read from a guard) that is not the guard's: [first, last], or
// {npos, npos} when untouched.
std::pair<size_t, size_t> written(const std::vector<unsigned char>& bytes) {
  size_t first = std::string::npos, last = std::string::npos;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] != kGuardByte) {
      if (first == std::string::npos) first = i;
      last = i;
    }
  return {first, last};
}
}  // namespace

GuardedWorkspace::GuardedWorkspace(const MemoryOps& memory, int first_slot)
    : memory_(memory), first_slot_(first_slot) {}

GuardedWorkspace::~GuardedWorkspace() {
  for (const std::vector<Region>* list : {&live_, &retired_})
    for (const Region& r : *list) memory_.release(r.base);  // waits for the kernels using it
}

GuardedWorkspace::Region GuardedWorkspace::allocate(int slot, size_t bytes) const {
  Region r;
  r.slot = slot, r.bytes = bytes, r.after = guard_after(bytes);
  // kAlign more than needed, so that the region can start on a kAlign boundary wherever the
  // allocation does (the host's malloc promises 16 bytes).
  const size_t total = kAlign + kGuardBefore + bytes + r.after;
  r.base = static_cast<unsigned char*>(memory_.allocate(total));
  const auto start = reinterpret_cast<uintptr_t>(r.base) + kGuardBefore;
  r.before = kGuardBefore + (kAlign - start % kAlign) % kAlign;
  // In pieces: a region may be gigabytes.
  const std::vector<unsigned char> fill(std::min(total, kFillPiece), kGuardByte);
  for (size_t at = 0; at < total; at += fill.size())
    memory_.upload(nullptr, r.base + at, fill.data(), std::min(fill.size(), total - at));
  return r;
}

void* GuardedWorkspace::get(int slot, size_t bytes) {
  if (slot < 0) throw std::logic_error("workspace: negative slot");
  auto it =
      std::find_if(live_.begin(), live_.end(), [&](const Region& r) { return r.slot == slot; });
  if (it != live_.end() && it->bytes >= bytes) return it->data();
  Region fresh = allocate(slot, bytes);
  ++moves_;
  if (it == live_.end()) {
    live_.push_back(fresh);
    return live_.back().data();
  }
  retired_.push_back(*it);  // work already queued may still use it: released at the end
  *it = fresh;
  return it->data();
}

std::vector<std::string> GuardedWorkspace::stray_writes() const {
  std::vector<std::string> lines;
  for (const std::vector<Region>* list : {&live_, &retired_})
    for (const Region& r : *list) {
      std::vector<unsigned char> before(r.before), after(r.after);
      memory_.download(nullptr, before.data(), r.base, r.before);
      memory_.download(nullptr, after.data(), r.data() + r.bytes, r.after);
      const std::string name = "scratch region " + std::to_string(r.slot - first_slot_) +
                               " (asked for " + std::to_string(r.bytes) + " bytes)";
      if (const auto [first, last] = written(before); first != std::string::npos)
        lines.push_back(name + ": written " + bytes_text(r.before - first) + " before its start");
      if (const auto [first, last] = written(after); last != std::string::npos)
        lines.push_back(name + ": written up to " + bytes_text(last + 1) + " past its end");
    }
  return lines;
}

}  // namespace divlab
