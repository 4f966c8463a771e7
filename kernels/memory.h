// Where a backend's tensors live, and an owning buffer over it.
//
// The model and the optimizer hold every tensor in a Buffer allocated through their KernelSet's
// MemoryOps: host memory for the CPU backend, device memory for CUDA. Host code touches a buffer's
// contents only through upload/download, so the same model code runs on either backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/op_context.h"

namespace divlab {

// An allocation the backend could not satisfy (device memory exhausted); what() says how much.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every operation that orders itself with the kernels takes the stream it is ordered on (a
// cudaStream_t; null: the legacy default stream; ignored on the host), as every op does through its
// context: a model on its own stream keeps all of its work there.
struct MemoryOps {
  const char* device = "cpu";       // "cpu" | "cuda"
  bool host_accessible = true;      // may host code dereference the pointers?
  void* (*allocate)(size_t bytes);  // throws OutOfMemory
  void (*release)(void* p);         // p may be null
  void (*zero)(void* stream, void* p, size_t bytes);
  // Return once the host side may be reused (upload) or holds the values (download).
  void (*upload)(void* stream, void* dst, const void* host_src, size_t bytes);
  void (*download)(void* stream, void* host_dst, const void* src, size_t bytes);
  // Between two places of this memory, queued behind the stream's work (immediate on the host).
  void (*copy)(void* stream, void* dst, const void* src, size_t bytes);
  void (*synchronize)(void* stream);  // waits for the stream's queued work (a no-op on the host)
  // Host memory the backend copies to and from fastest (page-locked for CUDA), for staging.
  void* (*allocate_staging)(size_t bytes);  // throws OutOfMemory
  void (*release_staging)(void* p);
  // Copies queued behind the stream's work without waiting for it (the host side must be
  // staging memory that stays alive, and unread, until a later fence has passed); immediate
  // copies on the host. Shadow mode uses them so a shadowed step never drains the GPU's queue.
  void (*upload_async)(void* stream, void* dst, const void* staging_src, size_t bytes);
  void (*download_async)(void* stream, void* staging_dst, const void* src, size_t bytes);
  // A marker behind everything queued on the stream so far (null on the host), and the wait for
  // it from any thread; wait_fence also releases it.
  void* (*fence)(void* stream);
  void (*wait_fence)(void* fence);
  // Timing marks, for the profiler: a mark behind everything queued on the stream so far (on the
  // host, the time it is taken), the seconds from a mark to a later one of the same stream
  // (waiting for the later one to pass), and a mark's release.
  void* (*time_mark)(void* stream);
  double (*seconds_between)(void* first, void* later);
  void (*release_mark)(void* mark);
  // Scratch memory for one caller's op contexts (kernels/op_context.h), in this memory.
  std::unique_ptr<Workspace> (*make_workspace)();
  // A stream of its own for one caller (null on the host). It is ordered with the legacy default
  // stream, where buffers are allocated and released, so a buffer outlives its last use.
  void* (*create_stream)();
  void (*destroy_stream)(void* stream);
  // Work queued on a stream recorded instead of run, to be replayed as a whole (a CUDA graph; null
  // on the host, which has none). Between begin_capture and end_capture nothing queued on the
  // stream runs; end_capture returns the replayable graph, or null where something queued could
  // not be recorded (nothing of it ran then either). The stream must be one of create_stream's.
  void (*begin_capture)(void* stream) = nullptr;
  void* (*end_capture)(void* stream) = nullptr;
  void (*replay)(void* graph, void* stream) = nullptr;
  void (*release_graph)(void* graph) = nullptr;
  // Bytes of this memory in use, for check's leak probe: this process's where the driver tells
  // them, else every process's on the device; null on the host, whose heap check reads itself.
  size_t (*bytes_in_use)() = nullptr;
  // Queues a wait of `seconds` on the stream, measured on the device (null on the host): what
  // follows on the stream starts that much later, whatever the host does meanwhile.
  void (*hold)(void* stream, double seconds) = nullptr;
};

// A stream from `memory`, released with it.
class OwnedStream {
 public:
  explicit OwnedStream(const MemoryOps& memory) : mem_(&memory), stream_(memory.create_stream()) {}
  ~OwnedStream() {
    if (stream_) mem_->destroy_stream(stream_);
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  void* get() const { return stream_; }

 private:
  const MemoryOps* mem_;
  void* stream_;
};

// Plain host memory (malloc, memset, memcpy).
const MemoryOps& host_memory();

// n values of V in a backend's staging memory (page-locked on CUDA): the host side of copies
// queued with upload_async and download_async, which must stay alive and untouched until a
// fence behind them has passed. Uninitialised.
template <class V>
class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(const MemoryOps& mem, int64_t n) : mem_(&mem), n_(n) {
    if (n > 0) p_ = static_cast<V*>(mem.allocate_staging(sizeof(V) * size_t(n)));
  }
  StagingBuffer(StagingBuffer&& o) noexcept { swap(o); }
  StagingBuffer& operator=(StagingBuffer&& o) noexcept {
    StagingBuffer(std::move(o)).swap(*this);
    return *this;
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() {
    if (p_) mem_->release_staging(p_);
  }
  V* data() { return p_; }
  const V* data() const { return p_; }
  int64_t size() const { return n_; }

 private:
  void swap(StagingBuffer& o) noexcept {
    std::swap(mem_, o.mem_), std::swap(p_, o.p_), std::swap(n_, o.n_);
  }
  const MemoryOps* mem_ = nullptr;
  V* p_ = nullptr;
  int64_t n_ = 0;
};

// An owning, move-only array of n values of T in a backend's memory; zeroed on allocation.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const MemoryOps& mem, int64_t n) : mem_(&mem), n_(n) {
    if (n > 0) {
      p_ = static_cast<T*>(mem.allocate(sizeof(T) * size_t(n)));
      mem.zero(nullptr, p_, sizeof(T) * size_t(n));
    }
  }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer(std::move(o)).swap(*this);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (p_) mem_->release(p_);
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const MemoryOps& memory() const { return *mem_; }

  // The copies below are ordered on `stream` (null: the legacy default stream; see MemoryOps).
  void zero(void* stream = nullptr) {
    if (n_) mem_->zero(stream, p_, sizeof(T) * size_t(n_));
  }
  // Copies n values from host memory into the buffer, starting at element `at`.
  void upload(const T* host, int64_t n, int64_t at = 0, void* stream = nullptr) {
    if (n) mem_->upload(stream, p_ + at, host, sizeof(T) * size_t(n));
  }
  void download(T* host, int64_t n, int64_t at = 0, void* stream = nullptr) const {
    if (n) mem_->download(stream, host, p_ + at, sizeof(T) * size_t(n));
  }
  // Copies every value of `src` (a buffer of the same memory) into this one from element `at`.
  void copy_from(const Buffer& src, int64_t at = 0, void* stream = nullptr) {
    if (at < 0 || at + src.n_ > n_) throw std::out_of_range("Buffer::copy_from: past the end");
    if (src.n_) mem_->copy(stream, p_ + at, src.p_, sizeof(T) * size_t(src.n_));
  }
  std::vector<T> to_vector(void* stream = nullptr) const {
    std::vector<T> v(static_cast<size_t>(n_));
    download(v.data(), n_, 0, stream);
    return v;
  }
  // Replaces the contents from a host vector of the same length (or of any length converting
  // to T, e.g. double checkpoints into a float model).
  template <class U>
  void assign(const std::vector<U>& host, void* stream = nullptr) {
    std::vector<T> v(host.begin(), host.end());
    upload(v.data(), int64_t(v.size()), 0, stream);
  }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(mem_, o.mem_), std::swap(p_, o.p_), std::swap(n_, o.n_);
  }
  const MemoryOps* mem_ = nullptr;
  T* p_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace divlab
