#include "kernels/memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace divlab {

namespace {
void* host_allocate(size_t bytes) {
  void* p = std::malloc(bytes);
  if (!p) throw OutOfMemory("out of host memory allocating " + std::to_string(bytes) + " bytes");
  return p;
}
void host_release(void* p) {
  std::free(p);
}
void host_zero(void* p, size_t bytes) {
  std::memset(p, 0, bytes);
}
void host_copy(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void host_synchronize() {}
void* host_fence() {
  return nullptr;
}
void host_wait_fence(void*) {}
}  // namespace

const MemoryOps& host_memory() {
  static const MemoryOps ops{"cpu",     true,      host_allocate,    host_release,   host_zero,
                             host_copy, host_copy, host_synchronize, host_allocate,  host_release,
                             host_copy, host_copy, host_fence,       host_wait_fence};
  return ops;
}

}  // namespace divlab
