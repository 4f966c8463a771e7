#include "kernels/memory.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace divlab {

namespace {
// Every host buffer starts on a 64-byte boundary, the widest vector a CPU kernel loads (AVX-512).
// Eigen peels a loop's unaligned head before its vector body, so where an array starts decides
// how a sum is split and so its rounding: with malloc's 16-byte alignment a small model's bits
// depended on the heap's state (`divlab train` and `train --profile` parted by an ulp on the same
// config, 2026-11-29). Aligned, every tensor's alignment is a function of the layout alone.
constexpr size_t kHostAlign = 64;
void* host_allocate(size_t bytes) {
  void* p = std::aligned_alloc(kHostAlign, (bytes + kHostAlign - 1) / kHostAlign * kHostAlign);
  if (!p) throw OutOfMemory("out of host memory allocating " + std::to_string(bytes) + " bytes");
  return p;
}
void host_release(void* p) {
  std::free(p);
}
void host_zero(void* /*stream*/, void* p, size_t bytes) {
  std::memset(p, 0, bytes);
}
void host_copy(void* /*stream*/, void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void host_synchronize(void* /*stream*/) {}
void* host_fence(void* /*stream*/) {
  return nullptr;
}
void* host_create_stream() {
  return nullptr;
}
void host_destroy_stream(void* /*stream*/) {}
void host_wait_fence(void*) {}
void* host_time_mark(void* /*stream*/) {
  return new std::chrono::steady_clock::time_point(std::chrono::steady_clock::now());
}
double host_seconds_between(void* first, void* later) {
  using Mark = std::chrono::steady_clock::time_point;
  return std::chrono::duration<double>(*static_cast<Mark*>(later) - *static_cast<Mark*>(first))
      .count();
}
void host_release_mark(void* mark) {
  delete static_cast<std::chrono::steady_clock::time_point*>(mark);
}
std::unique_ptr<Workspace> host_workspace() {
  return std::make_unique<HostWorkspace>();
}
}  // namespace

void* HostWorkspace::get(int slot, size_t bytes) {
  if (slot < 0) throw std::logic_error("workspace: negative slot");
  if (size_t(slot) >= regions_.size()) regions_.resize(size_t(slot) + 1);
  Region& r = regions_[size_t(slot)];
  if (r.bytes < bytes) {
    constexpr size_t kAlign = 256;
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p)
      throw OutOfMemory("out of host memory for " + std::to_string(bytes) + " bytes of scratch");
    // All-ones bytes (NaN as float and double), not the zeros new memory happens to hold: a
    // kernel that reads scratch before writing it reads NaN at once.
    std::memset(p, 0xFF, rounded);
    r.data.reset(static_cast<unsigned char*>(p));
    r.bytes = bytes, ++moves_;
  }
  return r.data.get();
}

OpContextSource::OpContextSource(const MemoryOps& memory, void* stream)
    : stream_(stream), workspace_(memory.make_workspace()) {}
OpContextSource::~OpContextSource() = default;
OpContextSource::OpContextSource(OpContextSource&&) noexcept = default;
OpContextSource& OpContextSource::operator=(OpContextSource&&) noexcept = default;

const MemoryOps& host_memory() {
  static const MemoryOps ops{"cpu",
                             true,
                             host_allocate,
                             host_release,
                             host_zero,
                             host_copy,
                             host_copy,
                             host_copy,
                             host_synchronize,
                             host_allocate,
                             host_release,
                             host_copy,
                             host_copy,
                             host_fence,
                             host_wait_fence,
                             host_time_mark,
                             host_seconds_between,
                             host_release_mark,
                             host_workspace,
                             host_create_stream,
                             host_destroy_stream,
                             nullptr,  // no graphs: the host runs each call as it comes
                             nullptr,
                             nullptr,
                             nullptr};
  return ops;
}

}  // namespace divlab
