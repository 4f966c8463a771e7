#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

void fail(const std::string& what, const char* file, int line) {
  throw CudaError(what + " (" + file + ":" + std::to_string(line) + ")");
}

void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  const std::string what = std::string("CUDA error ") + cudaGetErrorName(e) + " (" +
                           cudaGetErrorString(e) + ") in " + call;
  if (e == cudaErrorMemoryAllocation)
    throw OutOfDeviceMemory(what + " (" + file + ":" + std::to_string(line) + ")");
  fail(what, file, line);
}

void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  fail(std::string("cuBLAS error ") + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) +
           ") in " + call,
       file, line);
}

void check_launch(const OpContext& ctx, const char* kernel, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && debug_sync(ctx))
    e = cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream));
  if (e != cudaSuccess)
    fail(std::string("kernel ") + kernel + " failed: " + cudaGetErrorName(e) + " (" +
             cudaGetErrorString(e) + ")",
         file, line);
}

bool debug_sync(const OpContext& ctx) {
  // DIVLAB_CUDA_SYNC=1 turns it on for every caller (the environment, read once, is the
  // process's; the config's debug.sync_kernels is the run's, carried in its op contexts).
  static const bool everywhere = [] {
    const char* env = std::getenv("DIVLAB_CUDA_SYNC");
    return env && env[0] == '1';
  }();
  return ctx.sync_each_launch || everywhere;
}

DeviceInfo query_device(std::string* error) {
  DeviceInfo info;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (error)
      *error = e != cudaSuccess ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)
                                : "no CUDA device";
    cudaGetLastError();  // clear the sticky-free error so later queries start clean
    return info;
  }
  cudaDeviceProp prop{};
  DIVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  info.count = count;
  info.name = prop.name;
  info.major = prop.major, info.minor = prop.minor;
  DIVLAB_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

namespace {
cudaMemPool_t memory_pool();
}

void check_fits(size_t bytes, const std::string& what) {
  size_t free_bytes = 0, total = 0;
  DIVLAB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  // Memory the pool keeps from freed buffers is reused by the next allocation, though the device
  // counts it as taken.
  uint64_t reserved = 0, used = 0;
  DIVLAB_CUDA_CHECK(
      cudaMemPoolGetAttribute(memory_pool(), cudaMemPoolAttrReservedMemCurrent, &reserved));
  DIVLAB_CUDA_CHECK(cudaMemPoolGetAttribute(memory_pool(), cudaMemPoolAttrUsedMemCurrent, &used));
  if (reserved > used) free_bytes += size_t(reserved - used);
  const size_t margin = size_t(512) << 20;  // cuBLAS workspace, scratch, the CUDA context's slack
  if (bytes + margin > free_bytes) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s needs %.2f GiB of device memory; %.2f GiB of %.2f GiB free",
                  what.c_str(), double(bytes) / (1 << 30), double(free_bytes) / (1 << 30),
                  double(total) / (1 << 30));
    if (bytes + margin <= total) throw DeviceBusy(buf);
    throw OutOfDeviceMemory(buf);
  }
}

namespace {
// Buffers are stream-ordered allocations on the default stream, where all our work runs: unlike
// cudaFree, cudaFreeAsync does not synchronise the device, so short-lived buffers (shadow
// replays, checks) do not drain the GPU's queue. The pool keeps freed memory for reuse; when an
// allocation fails it is trimmed and the allocation retried once before we call it out of memory.
cudaMemPool_t memory_pool() {
  static cudaMemPool_t pool = [] {
    int device = 0;
    DIVLAB_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPool_t p = nullptr;
    DIVLAB_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&p, device));
    uint64_t keep = UINT64_MAX;
    DIVLAB_CUDA_CHECK(cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep));
    return p;
  }();
  return pool;
}

void* device_allocate(size_t bytes) {
  void* p = nullptr;
  const cudaMemPool_t pool = memory_pool();
  cudaError_t e = cudaMallocAsync(&p, bytes, 0);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    DIVLAB_CUDA_CHECK(cudaDeviceSynchronize());
    DIVLAB_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
    e = cudaMallocAsync(&p, bytes, 0);
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    char buf[160];
    std::snprintf(
        buf, sizeof buf, "out of device memory: allocating %.3f GiB failed (%.2f of %.2f GiB free)",
        double(bytes) / (1 << 30), double(free_bytes) / (1 << 30), double(total) / (1 << 30));
    throw OutOfMemory(buf);
  }
  DIVLAB_CUDA_CHECK(e);
  return p;
}
void device_release(void* p) {
  cudaFreeAsync(p, 0);  // never throws: called from destructors
}
void device_zero(void* stream, void* p, size_t bytes) {
  DIVLAB_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(stream)));
}
void device_upload(void* stream, void* dst, const void* src, size_t bytes) {
  const auto s = static_cast<cudaStream_t>(stream);
  DIVLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  DIVLAB_CUDA_CHECK(cudaStreamSynchronize(s));  // the caller may reuse the source at once
}
void device_download(void* stream, void* dst, const void* src, size_t bytes) {
  const auto s = static_cast<cudaStream_t>(stream);
  DIVLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  DIVLAB_CUDA_CHECK(cudaStreamSynchronize(s));
}

void device_copy(void* stream, void* dst, const void* src, size_t bytes) {
  DIVLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                    static_cast<cudaStream_t>(stream)));
}

void* pinned_allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    throw OutOfMemory("out of page-locked host memory: allocating " + std::to_string(bytes) +
                      " bytes failed");
  }
  return p;
}
void pinned_release(void* p) {
  cudaFreeHost(p);  // never throws: called from destructors
}

void device_synchronize(void* stream) {
  DIVLAB_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

// On the caller's stream, in order with the kernels around them.
void device_upload_async(void* stream, void* dst, const void* src, size_t bytes) {
  DIVLAB_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
}
void device_download_async(void* stream, void* dst, const void* src, size_t bytes) {
  DIVLAB_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)));
}
void* device_fence(void* stream) {
  cudaEvent_t e = nullptr;
  DIVLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  DIVLAB_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
  return e;
}
// A blocking stream (cudaStreamCreate's default): the legacy default stream, where buffers are
// allocated and released, waits for it and it for the legacy stream, so a buffer released there
// is never reused while a kernel on this stream may still touch it.
void* device_create_stream() {
  cudaStream_t s = nullptr;
  DIVLAB_CUDA_CHECK(cudaStreamCreate(&s));
  return s;
}
void device_destroy_stream(void* stream) {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));  // never throws: called from destructors
}
void device_wait_fence(void* fence) {
  const auto e = static_cast<cudaEvent_t>(fence);
  const cudaError_t status = cudaEventSynchronize(e);
  cudaEventDestroy(e);
  DIVLAB_CUDA_CHECK(status);
}

// Timing events: between two of them on one stream, the device's time for what ran between.
void* device_time_mark(void* stream) {
  cudaEvent_t e = nullptr;
  DIVLAB_CUDA_CHECK(cudaEventCreate(&e));
  DIVLAB_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
  return e;
}
double device_seconds_between(void* first, void* later) {
  float ms = 0;
  DIVLAB_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(later)));
  DIVLAB_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(first), static_cast<cudaEvent_t>(later)));
  return ms * 1e-3;
}
void device_release_mark(void* mark) {
  cudaEventDestroy(static_cast<cudaEvent_t>(mark));  // never throws: the profiler's cleanup
}

// Thread-local capture: another thread's unrelated CUDA calls (a shadow worker's, a trace
// writer's) neither fail nor end it.
void device_begin_capture(void* stream) {
  DIVLAB_CUDA_CHECK(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
}
void* device_end_capture(void* stream) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph) != cudaSuccess || !graph) {
    cudaGetLastError();  // an invalidated capture's error is this call's, not a later launch's
    if (graph) cudaGraphDestroy(graph);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return exec;
}
void device_replay(void* graph, void* stream) {
  DIVLAB_CUDA_CHECK(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream)));
}
void device_release_graph(void* graph) {
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));  // never throws: destructors call it
}

// One thread reading the device's nanosecond timer until `ns` have passed.
__global__ void hold_kernel(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
void device_hold(void* stream, double seconds) {
  hold_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(uint64_t(seconds * 1e9));
  DIVLAB_CUDA_CHECK(cudaGetLastError());
}

std::unique_ptr<Workspace> device_workspace() {
  return std::make_unique<DeviceWorkspace>();
}
}  // namespace

const MemoryOps& device_memory() {
  static const MemoryOps ops{"cuda",
                             false,
                             device_allocate,
                             device_release,
                             device_zero,
                             device_upload,
                             device_download,
                             device_copy,
                             device_synchronize,
                             pinned_allocate,
                             pinned_release,
                             device_upload_async,
                             device_download_async,
                             device_fence,
                             device_wait_fence,
                             device_time_mark,
                             device_seconds_between,
                             device_release_mark,
                             device_workspace,
                             device_create_stream,
                             device_destroy_stream,
                             device_begin_capture,
                             device_end_capture,
                             device_replay,
                             device_release_graph,
                             device_bytes_in_use,
                             device_hold};
  return ops;
}

cublasHandle_t cublas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    DIVLAB_CUBLAS_CHECK(cublasCreate(&h));
    // Deterministic results need a fixed workspace and no atomics-based algorithms.
    DIVLAB_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
    DIVLAB_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    return h;
  }();
  return handle;
}

DeviceWorkspace::~DeviceWorkspace() {
  for (const Region& r : regions_)
    if (r.p) cudaFree(r.p);  // never throws: a destructor; cudaFree waits for the kernels using it
}

void* DeviceWorkspace::get(int slot, size_t bytes) {
  if (slot < 0) throw std::logic_error("workspace: negative slot");
  if (size_t(slot) >= regions_.size()) regions_.resize(size_t(slot) + 1);
  Region& r = regions_[size_t(slot)];
  if (r.bytes < bytes) {
    // cudaFree waits for every kernel, on every stream, that may still read the old region.
    if (r.p) DIVLAB_CUDA_CHECK(cudaFree(r.p));
    r.p = nullptr, r.bytes = 0;
    DIVLAB_CUDA_CHECK(cudaMalloc(&r.p, bytes));
    // All-ones bytes (NaN as float and double), not whatever the allocation held (zeros, often):
    // a kernel that reads scratch before writing it reads NaN at once (HostWorkspace alike).
    DIVLAB_CUDA_CHECK(cudaMemset(r.p, 0xFF, bytes));
    r.bytes = bytes;
    ++moves_;
  }
  return r.p;
}

cublasHandle_t cublas(const OpContext& ctx) {
  // cuBLAS's own default workspace belongs to the handle, whatever the stream: kernels of two
  // streams would share it.
  const cublasHandle_t h = cublas();
  DIVLAB_CUBLAS_CHECK(cublasSetStream(h, stream_of(ctx)));
  if (ctx.workspace)
    DIVLAB_CUBLAS_CHECK(cublasSetWorkspace(h, cublas_workspace(ctx), kCublasWorkspaceBytes));
  return h;
}

void* cublas_workspace(const OpContext& ctx) {
  return scratch(ctx, Scratch::Cublas, kCublasWorkspaceBytes);
}

DeviceWorkspace& device_workspace_of(const OpContext& ctx) {
  auto* w = dynamic_cast<DeviceWorkspace*>(ctx.workspace);
  if (!w) throw std::logic_error("cuda: an op was called without a device workspace");
  return *w;
}

void* scratch(const OpContext& ctx, Scratch slot, size_t bytes) {
  if (!ctx.workspace)
    throw std::logic_error("cuda: an op was called without a workspace (OpContext::workspace)");
  return ctx.workspace->get(int(slot), bytes);
}

}  // namespace divlab::cuda
