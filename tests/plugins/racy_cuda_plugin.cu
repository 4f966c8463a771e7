// A CUDA plug-in (ABI 2) with two races that one call at a time rarely or never shows:
// - `add` written through a staging buffer in static device memory, shared by every call in the
//   process: exact alone, two calls in flight on different streams overwrite each other's staged
//   sums. `divlab check --backend cuda` must fail it under "concurrent load" only.
// - `rmsnorm_forward` staging each tile of a row in shared memory without the barrier after the
//   tile is read: a warp's next tile can overwrite values a slower warp has yet to read. Warps of
//   a block stay close enough that the values come out right; compute-sanitizer's racecheck
//   reports the hazard every time, and check's sanitizer pass must fail it.
// - `add` on a stream of its own, never ordered with the one it is given: check's "concurrent
//   load" writes each call's inputs on the given stream just before it and must fail it.
// And one fault no single call shows: `add` through device scratch of its own, allocated at every
// call and never released; check's "call 257 (warmed up)" must fail it on the device's memory.
// And `add` staged in the context's scratch, asked for one value less than it writes: check's
// guarded scratch must name the write past its end in every condition.
// And one fault no small call shows: `add` on a grid capped at 65 535 blocks of 256 threads with
// no grid-stride loop, exact up to 2^24 values and leaving the rest unwritten past them; check's
// "arrays past 2^24" must fail it, alone.
// And one launch that fails past the sizes tested: `rmsnorm_forward` one thread a channel, a
// block a row, so past 1024 channels the launch is invalid and nothing is written; the error is
// left pending. check names it under "channels wide" alone, and a run stops at the call.
// And one misuse of a barrier that the GPU forgives: `rmsnorm_forward` with a barrier only the
// threads holding a channel reach, the others waiting at the next one. Its values are right at
// every shape; compute-sanitizer's synccheck reports the warp split between the two, and check's
// sanitizer pass must fail it under synccheck alone.
// And one index no array of the tested sizes wraps: a cross-entropy whose rows start at an
// unsigned 32-bit offset, exact up to 2^32 values and, past them, reading and writing the first
// rows' logits for the last rows'; check's "logits past 2^32" must fail it, alone.
// (tests/gpu/test_gpu_cli.cpp)
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/plugin_abi.h"

namespace {

constexpr int64_t kStageValues = int64_t(1) << 21;
__device__ float g_stage[kStageValues];

__global__ void stage_sum(const float* a, const float* b, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) g_stage[i] = a[i] + b[i];
}
__global__ void copy_out(float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = g_stage[i];
}
__global__ void add_direct(float* y, const float* a, const float* b, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}

void add_staged(const divlab_op_context* ctx, float* y, const float* a, const float* b, int64_t n) {
  const auto stream = static_cast<cudaStream_t>(ctx->stream);
  const unsigned blocks = unsigned((n + 255) / 256);
  if (n > kStageValues) {
    add_direct<<<blocks, 256, 0, stream>>>(y, a, b, n);
    return;
  }
  stage_sum<<<blocks, 256, 0, stream>>>(a, b, n);
  copy_out<<<blocks, 256, 0, stream>>>(y, n);
}

void add_leaking(const divlab_op_context* ctx, float* y, const float* a, const float* b,
                 int64_t n) {
  const auto stream = static_cast<cudaStream_t>(ctx->stream);
  float* scratch = nullptr;
  if (cudaMalloc(&scratch, sizeof(float) * size_t(n)) != cudaSuccess) return;
  add_direct<<<unsigned((n + 255) / 256), 256, 0, stream>>>(scratch, a, b, n);
  cudaMemcpyAsync(y, scratch, sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice, stream);
}

// `add` on a non-blocking stream of its own that never waits for the one it is given: the values
// are right wherever the inputs were written before the call was queued (every one-call condition),
// and wrong where they arrive on the given stream just before it, as in training.
void add_own_stream(const divlab_op_context*, float* y, const float* a, const float* b, int64_t n) {
  static cudaStream_t own = nullptr;
  if (!own && cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) != cudaSuccess) return;
  add_direct<<<unsigned((n + 255) / 256), 256, 0, own>>>(y, a, b, n);
}

// The sum staged in scratch sized for n - 1 values: its last value lands past the region.
void add_scratch_one_short(const divlab_op_context* ctx, float* y, const float* a, const float* b,
                           int64_t n) {
  const auto stream = static_cast<cudaStream_t>(ctx->stream);
  auto* sum = static_cast<float*>(ctx->workspace(ctx, 0, sizeof(float) * size_t(n - 1)));
  if (!sum) return;
  add_direct<<<unsigned((n + 255) / 256), 256, 0, stream>>>(sum, a, b, n);
  cudaMemcpyAsync(y, sum, sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice, stream);
}

// A grid capped at the y and z dimensions' limit, as if it held for x too, and no loop over the
// values past blocks x threads.
constexpr int64_t kGridCap = 65535;
void add_grid_capped(const divlab_op_context* ctx, float* y, const float* a, const float* b,
                     int64_t n) {
  const int64_t blocks = std::min((n + 255) / 256, kGridCap);
  add_direct<<<unsigned(blocks), 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(y, a, b, n);
}

// A grid-wide barrier made of a counter in scratch: each block's first thread adds one and waits
// until every block has. Right while the whole grid is resident at once; past what the GPU holds
// (an H200 holds 1056 blocks of 256), the waiting blocks keep the rest from ever starting.
__global__ void add_after_grid_barrier(float* y, const float* a, const float* b, int64_t n,
                                       unsigned* arrived) {
  if (threadIdx.x == 0) {
    atomicAdd(arrived, 1u);
    while (atomicAdd(arrived, 0u) < gridDim.x) {
    }
  }
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}
void add_grid_barrier(const divlab_op_context* ctx, float* y, const float* a, const float* b,
                      int64_t n) {
  const auto stream = static_cast<cudaStream_t>(ctx->stream);
  auto* arrived = static_cast<unsigned*>(ctx->workspace(ctx, 0, sizeof(unsigned)));
  if (!arrived || cudaMemsetAsync(arrived, 0, sizeof(unsigned), stream) != cudaSuccess) return;
  add_after_grid_barrier<<<unsigned((n + 255) / 256), 256, 0, stream>>>(y, a, b, n, arrived);
}

// One block of kTile threads a row; each thread squares its neighbour's value in the tile (a
// stand-in for any use of another thread's staged value).
constexpr int kTile = 128;
__global__ void rmsnorm_missing_barrier(float* y, float* rstd, const float* x, const float* w,
                                        int C, float eps) {
  __shared__ float tile[kTile];
  __shared__ float warp_sums[kTile / 32];
  const float* row = x + int64_t(blockIdx.x) * C;
  float ss = 0;
  for (int c0 = 0; c0 < C; c0 += kTile) {
    tile[threadIdx.x] = c0 + int(threadIdx.x) < C ? row[c0 + threadIdx.x] : 0.0f;
    __syncthreads();
    const float v = tile[(threadIdx.x + 1) % kTile];
    ss += v * v;
    // Missing here: __syncthreads(), before the next tile overwrites what others still read.
  }
  for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0;
  for (int k = 0; k < kTile / 32; ++k) total += warp_sums[k];
  const float r = 1.0f / sqrtf(total / float(C) + eps);
  for (int c = int(threadIdx.x); c < C; c += kTile)
    y[int64_t(blockIdx.x) * C + c] = row[c] * r * w[c];
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

void rmsnorm_forward_missing_barrier(const divlab_op_context* ctx, float* y, float* rstd,
                                     const float* x, const float* w, int N, int C, float eps) {
  if (N == 0) return;
  rmsnorm_missing_barrier<<<N, kTile, 0, static_cast<cudaStream_t>(ctx->stream)>>>(y, rstd, x, w, C,
                                                                                   eps);
}

__global__ void rmsnorm_thread_per_channel(float* y, float* rstd, const float* x, const float* w,
                                           int C, float eps) {
  __shared__ float warp_sums[32];
  const float* row = x + int64_t(blockIdx.x) * C;
  const bool mine = int(threadIdx.x) < C;  // the block is C rounded up to whole warps
  const float v = mine ? row[threadIdx.x] : 0.0f;
  float ss = v * v;
  for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0;
  for (unsigned k = 0; k < (blockDim.x + 31) / 32; ++k) total += warp_sums[k];
  const float r = 1.0f / sqrtf(total / float(C) + eps);
  if (mine) y[int64_t(blockIdx.x) * C + threadIdx.x] = v * r * w[threadIdx.x];
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

// One block of kTile threads a row; thread 0 forms the row's scale and passes it through shared
// memory. The barrier after the squares are published is inside the guard of the threads that
// hold a channel: in a row narrower than the block the others wait at the next barrier instead,
// and where the row's end falls inside a warp that warp is split between two barriers. The block
// still meets (every thread arrives at one or the other, and the ones past the row need nothing
// they read), so the values are right on the GPUs the lab runs on; CUDA leaves it undefined
// (a barrier in code that threads of a block take differently).
__global__ void rmsnorm_barrier_in_branch(float* y, float* rstd, const float* x, const float* w,
                                          int C, float eps) {
  __shared__ float squares[kTile];
  __shared__ float scale;
  const float* row = x + int64_t(blockIdx.x) * C;
  float ss = 0;
  for (int c = int(threadIdx.x); c < C; c += kTile) ss += row[c] * row[c];
  squares[threadIdx.x] = ss;
  if (int(threadIdx.x) < C) __syncthreads();  // the misuse: the threads past the row skip it
  if (threadIdx.x == 0) {
    float total = 0;
    for (int k = 0; k < kTile; ++k) total += squares[k];
    scale = 1.0f / sqrtf(total / float(C) + eps);
    rstd[blockIdx.x] = scale;
  }
  __syncthreads();
  const float r = scale;
  for (int c = int(threadIdx.x); c < C; c += kTile)
    y[int64_t(blockIdx.x) * C + c] = row[c] * r * w[c];
}

void rmsnorm_forward_barrier_in_branch(const divlab_op_context* ctx, float* y, float* rstd,
                                       const float* x, const float* w, int N, int C, float eps) {
  if (N == 0) return;
  rmsnorm_barrier_in_branch<<<N, kTile, 0, static_cast<cudaStream_t>(ctx->stream)>>>(y, rstd, x, w,
                                                                                     C, eps);
}

// One block a row, one thread a channel (in whole warps).
void rmsnorm_forward_thread_per_channel(const divlab_op_context* ctx, float* y, float* rstd,
                                        const float* x, const float* w, int N, int C, float eps) {
  if (N == 0) return;
  const int threads = (C + 31) / 32 * 32;
  rmsnorm_thread_per_channel<<<N, threads, 0, static_cast<cudaStream_t>(ctx->stream)>>>(y, rstd, x,
                                                                                        w, C, eps);
}

// One block of 256 threads a row; the row's offset in 32 unsigned bits.
__global__ void cross_entropy_offset32_kernel(float* losses, float* dlogits, const float* logits,
                                              const divlab_token* targets, int V, float dloss) {
  constexpr int kThreads = 256;
  __shared__ float partial[kThreads];
  const unsigned offset = blockIdx.x * unsigned(V);  // wraps past 2^32 values
  const float* z = logits + offset;
  float m = -INFINITY;
  for (int v = int(threadIdx.x); v < V; v += kThreads) m = fmaxf(m, z[v]);
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k /= 2) {
    if (int(threadIdx.x) < k)
      partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + k]);
    __syncthreads();
  }
  m = partial[0];
  __syncthreads();
  float s = 0;
  for (int v = int(threadIdx.x); v < V; v += kThreads) s += expf(z[v] - m);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k /= 2) {
    if (int(threadIdx.x) < k) partial[threadIdx.x] += partial[threadIdx.x + k];
    __syncthreads();
  }
  const float lse = m + logf(partial[0]);
  const int target = targets[blockIdx.x];
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - z[target];
  if (dlogits == nullptr) return;
  for (int v = int(threadIdx.x); v < V; v += kThreads)
    dlogits[offset + unsigned(v)] = (expf(z[v] - lse) - (v == target ? 1.0f : 0.0f)) * dloss;
}

void cross_entropy_offset32(const divlab_op_context* ctx, float* losses, float* dlogits,
                            const float* logits, const divlab_token* targets, int N, int V,
                            float dloss) {
  if (N == 0) return;
  cross_entropy_offset32_kernel<<<N, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(
      losses, dlogits, logits, targets, V, dloss);
}

const divlab_variant2 kVariants[] = {
    {"add", "racy_staging", "cuda", DIVLAB_FP32, 0, reinterpret_cast<void (*)(void)>(&add_staged),
     "y = a + b through a staging buffer in static device memory",
     "every call shares the staging buffer: concurrent calls overwrite each other's sums",
     "two calls in flight at once (several streams, several models in one process)",
     "one stream, one call at a time"},
    {"rmsnorm_forward", "missing_barrier", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&rmsnorm_forward_missing_barrier),
     "rows staged in shared memory tile by tile, one block of 128 threads a row",
     "no barrier after a tile is read: the next tile may overwrite values not yet read",
     "rows wider than one tile, when a warp falls behind the others of its block",
     "rows of at most 128 values"},
    {"add", "leaks_device_scratch", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&add_leaking),
     "y = a + b through device scratch of its own (cudaMalloc at every call)",
     "the scratch is never released: device memory runs out a long run in",
     "many calls (every training step calls it)", "a few calls"},
    {"add", "own_stream", "cuda", DIVLAB_FP32, 0, reinterpret_cast<void (*)(void)>(&add_own_stream),
     "y = a + b on a stream of its own (cudaStreamNonBlocking), ignoring ctx->stream",
     "not ordered after the work that writes its inputs, nor before the work that reads y",
     "inputs written on the run's stream just before the call (every training step)",
     "inputs already in memory when the call is queued"},
    {"add", "scratch_one_short", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&add_scratch_one_short),
     "y = a + b staged in the context's scratch", "asks for one value less scratch than it writes",
     "a region whose rounded size ends where it asked", "rounded or larger regions"},
    {"add", "grid_capped", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&add_grid_capped),
     "y = a + b, one thread a value on at most 65 535 blocks of 256",
     "no grid-stride loop: values past 2^24 (65 535 x 256) are never written",
     "arrays past 16.8 M values (GPT-2 small's MLP activations, its parameters)",
     "every smaller array"},
    {"rmsnorm_forward", "barrier_in_branch", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&rmsnorm_forward_barrier_in_branch),
     "one block of 128 threads a row, the scale passed through shared memory",
     "a barrier only the threads holding a channel reach: undefined, forgiven by today's GPUs",
     "a compiler or GPU that takes CUDA at its word (the values are right today)",
     "rows of 128 channels or more"},
    {"rmsnorm_forward", "thread_per_channel", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&rmsnorm_forward_thread_per_channel),
     "one thread a channel, one block a row",
     "past 1024 channels the launch fails and the outputs are never written",
     "rows wider than 1024 (Llama 2 7B's 4096)", "GPT-2's 768"},
    {"cross_entropy", "offset32", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&cross_entropy_offset32),
     "one block a row, each row's offset an unsigned 32-bit product",
     "past 2^32 values the offset wraps: the last rows read and overwrite the first rows'",
     "logits past 2^32 values (85 400 tokens at GPT-2's 50 304 ids)", "every smaller step"},
    {"add", "grid_barrier", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&add_grid_barrier),
     "y = a + b after a grid-wide barrier (an atomic counter every block waits on)",
     "blocks beyond what the GPU holds at once never start while the others wait: a hang",
     "grids larger than the resident blocks (arrays of about 270 k values and more on an H200)",
     "small arrays"},
};
const divlab_plugin2 kPlugin = {DIVLAB_PLUGIN_ABI2_VERSION,
                                sizeof(kVariants) / sizeof(kVariants[0]), kVariants};

}  // namespace

const divlab_plugin2* divlab_plugin_register2(void) {
  return &kPlugin;
}
