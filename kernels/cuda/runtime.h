// The CUDA backend's runtime: checked calls, device memory, the cuBLAS handle, scratch space.
//
// Every CUDA, cuBLAS and cuDNN call goes through a DIVLAB_*_CHECK macro and every launch through
// check_launch(name): failures throw CudaError naming the call or kernel and the source line.
// With debug sync on (`debug.sync_kernels = true`, or DIVLAB_CUDA_SYNC=1), each launch is
// followed by a device synchronisation, so an asynchronous fault is reported at the kernel that
// caused it rather than at some later call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/memory.h"

namespace divlab::cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Device memory exhausted (also predicted before allocating: see check_fits).
struct OutOfDeviceMemory : CudaError {
  using CudaError::CudaError;
};
// The need fits the device's total memory but not what is free now: other processes (cells of
// the same sweep sharing the GPU) hold the rest, so the same run can start once they end.
struct DeviceBusy : OutOfDeviceMemory {
  using OutOfDeviceMemory::OutOfDeviceMemory;
};

[[noreturn]] void fail(const std::string& what, const char* file, int line);
void check_cuda(cudaError_t e, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t s, const char* call, const char* file, int line);

#define DIVLAB_CUDA_CHECK(call) ::divlab::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define DIVLAB_CUBLAS_CHECK(call) ::divlab::cuda::check_cublas((call), #call, __FILE__, __LINE__)

// After a <<<...>>> launch made for the call `ctx`: reports launch errors, and where the call
// asks for it (debug_sync), execution errors, naming the kernel.
void check_launch(const OpContext& ctx, const char* kernel, const char* file, int line);
#define DIVLAB_LAUNCHED(ctx, kernel) ::divlab::cuda::check_launch(ctx, kernel, __FILE__, __LINE__)

// Whether launches for `ctx` wait for their kernels: its sync_each_launch (debug.sync_kernels),
// or DIVLAB_CUDA_SYNC=1 in the environment.
bool debug_sync(const OpContext& ctx);

// Bytes of device memory this process holds on the current device where the driver's NVML
// tells them, else every process's (kernels/cuda/process_memory.cpp): check's leak probe.
size_t device_bytes_in_use();
int64_t own_device_bytes();  // NVML's count alone: -1 where it does not list this process

// What the trainer needs to know before choosing the backend.
struct DeviceInfo {
  int count = 0;
  std::string name;
  int major = 0, minor = 0;
  size_t free_bytes = 0, total_bytes = 0;
};
// Queries device 0; count = 0 (and `error` set) when there is no usable GPU.
DeviceInfo query_device(std::string* error);
// The compute capability this build runs on (sm_90 code plus compute_90 PTX).
constexpr int kMinMajor = 9;
// Throws OutOfDeviceMemory when `bytes` (plus a margin for cuBLAS and scratch) will not fit;
// DeviceBusy when it would fit an idle device.
void check_fits(size_t bytes, const std::string& what);

const MemoryOps& device_memory();

// The device's seconds for the work `queue` puts on `stream` (its timing marks around it; waits
// for the work to finish).
template <class Queue>
double device_seconds(cudaStream_t stream, Queue&& queue) {
  const MemoryOps& mem = device_memory();
  void* first = mem.time_mark(stream);
  queue();
  void* later = mem.time_mark(stream);
  const double seconds = mem.seconds_between(first, later);
  mem.release_mark(first), mem.release_mark(later);
  return seconds;
}

cublasHandle_t cublas();
// The handle, bound to the op's stream and to a cuBLAS workspace in the op's own workspace
// (Scratch::Cublas): two callers on two streams (the run and a shadow tap) never share one.
cublasHandle_t cublas(const OpContext& ctx);
// That workspace (cuBLASLt calls take it explicitly). 32 MiB is the size cuBLAS itself
// recommends for Hopper; the algorithms cuBLAS and cuBLASLt choose depend on it.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
void* cublas_workspace(const OpContext& ctx);

// The stream an op launches on (OpContext::stream; null: the legacy default stream).
inline cudaStream_t stream_of(const OpContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// Grow-only device scratch in the caller's workspace (OpContext::workspace), one region per
// slot, valid until the next request for the same slot in the same workspace.
// clang-format off
enum class Scratch {
  A, B, C, D, E, F, Reduce, Pointers,                          // the ops' work space
  Attention16, AttentionStats, Cudnn, CudnnRows, CudnnAccum,  // the fused cuDNN attention
  Cublas,                                                      // cuBLAS's, per caller
  Shadow,                                                      // shadow mode's row sums
  Count
};
// clang-format on
void* scratch(const OpContext& ctx, Scratch slot, size_t bytes);
template <class T>
T* scratch_as(const OpContext& ctx, Scratch slot, size_t n) {
  return static_cast<T*>(scratch(ctx, slot, n * sizeof(T)));
}

// Device memory regions for one caller's op contexts (MemoryOps::make_workspace).
class DeviceWorkspace final : public Workspace {
 public:
  ~DeviceWorkspace() override;
  void* get(int slot, size_t bytes) override;

  // The attention pair's forward output (kernels/attention/cuda.cu), keyed by the layer's `att`:
  // the forward leaves it where the caller keeps it and notes where, the backward reads it there.
  void note_attention_output(const void* att, const void* out) { attention_outputs_[att] = out; }
  const void* attention_output(const void* att) const {
    const auto it = attention_outputs_.find(att);
    return it == attention_outputs_.end() ? nullptr : it->second;
  }

 private:
  struct Region {
    void* p = nullptr;
    size_t bytes = 0;
  };
  std::vector<Region> regions_;
  std::map<const void*, const void*> attention_outputs_;
};
// The device workspace of an op call (a logic error where it has none).
DeviceWorkspace& device_workspace_of(const OpContext& ctx);

inline unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

}  // namespace divlab::cuda
