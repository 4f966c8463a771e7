// The fused first-RMSNorm backward + embedding-gradient scatter on the GPU, and the candidates
// the way they are written in the wild.
//
// All variants share the row part (dx0 = dresid + RMSNorm backward, per row), the norm gain's
// gradient (fixed-order column sums) and the position gradient; they differ in how the rows of
// dx0 reach the token-embedding gradient dwte:
//   reference        stable radix sort of positions by token (CUB), then each token's rows
//                    summed in position order in fp32, in fixed chunks of 64 sorted rows whose
//                    pieces are added in chunk order: deterministic.
//   fp64_accum       the same segments summed in double (a benign control).
//   fp32_reordered   float atomicAdd straight into dwte: fp32, order varies run to run (control).
//   bf16_accum       the seed bug as written in the wild: bf16 atomicAdd, with every row of dwte
//                    (by token) and dwpe (by position) its own bf16 accumulator, starting from
//                    what the buffer holds (a tied head's gradient), as the CPU's namesake. A
//                    frequent token's row collects thousands of adds; once its sum is 2^8
//                    times a term, the term rounds away.
//   fp16_accum       the same in fp16 (11 bits; overflows at 65504).
//   bf16_truncate_accum, bf16_stochastic_accum, bf16_stochastic_reused_seed
//                    the same accumulators with another rounding after each addition, written
//                    as a compare-and-swap loop on the 16-bit word (hardware bf16 atomicAdd only
//                    rounds to nearest); the rounding is lowp.h's, bit for bit, as on the CPU.
//   racy_scatter     non-atomic read-add-write into dwte from every position (lost updates when
//                    two positions of one token race), and a per-block position-gradient sum in
//                    shared memory without atomics (racecheck reports that one: it is in shared
//                    memory; the global race is invisible to it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "common/rng.h"
#include "kernels/common/lowp.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/embed_rmsnorm_backward/embed_rmsnorm_backward.h"

namespace divlab::cuda {

namespace {
struct Rows {
  const float* dx0;  // [N, C]
};

// The parts every variant shares (RMSNorm's backward onto dresid, and the norm gain's gradient);
// returns the rows the scatter reads. dy_norm is an activation gradient (A), the rest fp32.
template <class A>
Rows shared_rows(const OpContext& ctx, float* dw_norm, const A* dy_norm, const float* dresid,
                 const float* x0, const float* w_norm, const float* rstd, int N, int C) {
  float* dx0 = scratch_as<float>(ctx, Scratch::B, size_t(N) * C);
  rmsnorm_backward_onto(ctx, dx0, dresid, dw_norm, dy_norm, x0, w_norm, rstd, N, C);
  return {dx0};
}

// dwpe[t, c] += sum_b dx0[b, t, c], one thread per (t, c), b in order.
__global__ void position_grad_kernel(float* dwpe, const float* dx0, int B, int T_, int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T_) * C) return;
  float s = 0;
  for (int b = 0; b < B; ++b) s += dx0[int64_t(b) * T_ * C + i];
  dwpe[i] += s;
}
void position_grad(const OpContext& ctx, float* dwpe, const float* dx0, int B, int T_, int C) {
  position_grad_kernel<<<blocks_for(int64_t(T_) * C, 256), 256, 0, stream_of(ctx)>>>(dwpe, dx0, B,
                                                                                     T_, C);
  DIVLAB_LAUNCHED(ctx, "position_grad");
}

__global__ void iota_kernel(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

// The sorted positions are cut into fixed chunks of kChunk; a token's segment is summed in
// position order piece by piece (one piece per chunk it touches), and the pieces in chunk order:
// a fixed order, so deterministic, and parallel even when one token fills most of the batch (a
// block per whole segment left the hot token's block walking thousands of rows alone).
constexpr int kChunk = 64;

__device__ inline bool continues_past(const int* st, int i1, int N) {
  return i1 < N && st[i1] == st[i1 - 1];
}

// Pass 1, one block per chunk, threads over columns. A segment that starts and ends inside the
// chunk is complete: added to dwte here. The chunk's leading piece, when its first rows continue
// a segment begun in an earlier chunk, goes to lead[chunk] (the whole chunk, if the segment runs
// through it); the piece of a segment that starts here and runs past the chunk goes to
// open[chunk]. The chunk's sorted ids wait in shared memory, and a column's rows are loaded
// kBatch at a time before they are added in order: one load in flight per thread left each
// block waiting on 64 gathers in a row.
constexpr int kBatch = 16;

template <class Acc>
__global__ void chunk_pieces_kernel(float* dwte, Acc* lead, Acc* open, const float* dx0,
                                    const int* st, const int* sp, int N, int C) {
  __shared__ int tok[kChunk + 1], pos[kChunk];  // tok[0]: the token before the chunk, or -1
  const int chunk = blockIdx.x;
  const int i0 = chunk * kChunk, n = min(N, i0 + kChunk) - i0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) tok[j + 1] = st[i0 + j], pos[j] = sp[i0 + j];
  if (threadIdx.x == 0) tok[0] = i0 > 0 ? st[i0 - 1] : -1;
  __syncthreads();
  const bool continues = continues_past(st, i0 + n, N);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    bool leading = tok[0] == tok[1];
    Acc s = 0;
    for (int b = 0; b < n; b += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) v[j] = b + j < n ? dx0[int64_t(pos[b + j]) * C + c] : 0.0f;
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = b + j;
        if (i >= n) break;
        if (i > 0 && tok[i + 1] != tok[i]) {  // the piece [.., i) ends its segment
          if (leading)
            lead[int64_t(chunk) * C + c] = s, leading = false;
          else
            dwte[int64_t(tok[i]) * C + c] += float(s);
          s = 0;
        }
        s += Acc(v[j]);
      }
    }
    if (leading)
      lead[int64_t(chunk) * C + c] = s;
    else if (continues)
      open[int64_t(chunk) * C + c] = s;
    else
      dwte[int64_t(tok[n]) * C + c] += float(s);
  }
}

// Pass 2, one thread per (chunk, column) for the chunks whose last segment starts in them and
// runs on: its open piece plus the leading pieces of the chunks after, in order.
template <class Acc>
__global__ void close_segments_kernel(float* dwte, const Acc* lead, const Acc* open, const int* st,
                                      int N, int C, int chunks) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(chunks) * C) return;
  const int chunk = int(idx / C), c = int(idx % C);
  const int i0 = chunk * kChunk, i1 = min(N, i0 + kChunk);
  if (!continues_past(st, i1, N) || (i0 > 0 && st[i0 - 1] == st[i1 - 1])) return;
  const int tok = st[i1 - 1];
  Acc s = open[int64_t(chunk) * C + c];
  for (int k = chunk + 1; k * kChunk < N && st[k * kChunk] == tok; ++k)
    s += lead[int64_t(k) * C + c];
  dwte[int64_t(tok) * C + c] += float(s);
}

template <class Acc>
void sorted_scatter(const OpContext& ctx, float* dwte, const float* dx0, const TokenId* tokens,
                    int N, int C, int V) {
  int* ids = scratch_as<int>(ctx, Scratch::D, size_t(4) * N);
  int *positions = ids, *sorted_tokens = ids + N, *sorted_positions = ids + 2 * N;
  iota_kernel<<<blocks_for(N, 256), 256, 0, stream_of(ctx)>>>(positions, N);
  DIVLAB_LAUNCHED(ctx, "iota");
  int end_bit = 1;
  while (end_bit < 31 && (1 << end_bit) < V) ++end_bit;
  size_t temp_bytes = 0;
  DIVLAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, sorted_tokens,
                                                    positions, sorted_positions, N, 0, end_bit,
                                                    stream_of(ctx)));
  void* temp = scratch(ctx, Scratch::E, temp_bytes);
  // Radix sort is stable: equal tokens keep their positions in increasing order.
  DIVLAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted_tokens,
                                                    positions, sorted_positions, N, 0, end_bit,
                                                    stream_of(ctx)));
  const int chunks = (N + kChunk - 1) / kChunk;
  Acc* pieces = scratch_as<Acc>(ctx, Scratch::F, 2 * size_t(chunks) * C);
  const int passes = (C + 511) / 512;  // columns a thread takes: 512 threads at most, none idle
  const int threads = ((C + passes - 1) / passes + 31) / 32 * 32;
  chunk_pieces_kernel<Acc><<<chunks, threads, 0, stream_of(ctx)>>>(
      dwte, pieces, pieces + size_t(chunks) * C, dx0, sorted_tokens, sorted_positions, N, C);
  DIVLAB_LAUNCHED(ctx, "chunk_pieces");
  close_segments_kernel<Acc><<<blocks_for(int64_t(chunks) * C, 256), 256, 0, stream_of(ctx)>>>(
      dwte, pieces, pieces + size_t(chunks) * C, sorted_tokens, N, C, chunks);
  DIVLAB_LAUNCHED(ctx, "close_segments");
}

template <class Acc, class A>
void sorted_variant(const OpContext& ctx, float* dwte, float* dwpe, float* dw_norm,
                    const A* dy_norm, const float* dresid, const float* x0, const float* w_norm,
                    const float* rstd, const TokenId* tokens, int B, int T_, int C, int V) {
  const int N = B * T_;
  const Rows r = shared_rows(ctx, dw_norm, dy_norm, dresid, x0, w_norm, rstd, N, C);
  position_grad(ctx, dwpe, r.dx0, B, T_, C);
  sorted_scatter<Acc>(ctx, dwte, r.dx0, tokens, N, C, V);
}

// --- fp32 atomics straight into dwte (the control) --------------------------------------------
__global__ void atomic_scatter_f32(float* dwte, const float* dx0, const TokenId* tokens, int C,
                                   int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  atomicAdd(&dwte[int64_t(tokens[i / C]) * C + i % C], dx0[i]);
}

template <class A>
void fp32_reordered(const OpContext& ctx, float* dwte, float* dwpe, float* dw_norm,
                    const A* dy_norm, const float* dresid, const float* x0, const float* w_norm,
                    const float* rstd, const TokenId* tokens, int B, int T_, int C, int V) {
  const int N = B * T_;
  const Rows r = shared_rows(ctx, dw_norm, dy_norm, dresid, x0, w_norm, rstd, N, C);
  position_grad(ctx, dwpe, r.dx0, B, T_, C);
  const int64_t total = int64_t(N) * C;
  atomic_scatter_f32<<<blocks_for(total, 256), 256, 0, stream_of(ctx)>>>(dwte, r.dx0, tokens, C,
                                                                         total);
  DIVLAB_LAUNCHED(ctx, "atomic_scatter_f32");
}

// --- accumulation in a 16-bit format, the gradient's rows themselves the accumulators ---------
// As on the CPU (variants.cpp, scatter_rounded): each row of dwte (by token) and of dwpe (by
// position) accumulates in the format, starting from what the buffer holds (a tied head's dense
// gradient, rounded once to the format here), rounded after every addition; a row that nothing
// is added to keeps its fp32 value. What differs from the CPU is the order (the atomics') and,
// for bf16_accum and fp16_accum, the hardware's 16-bit atomicAdd, whose addend is rounded to the
// format before it is added. The rows travel as a 16-bit copy and are written back at the end.

// The row position n adds to, and the index its rounding's random bits are keyed on (the CPU's:
// the position for a token row, the batch row for a position row).
struct TokenRows {
  const TokenId* tokens;
  __device__ int64_t row(int64_t n) const { return tokens[n]; }
  __device__ int64_t key(int64_t n) const { return n; }
};
struct PositionRows {
  int T;
  __device__ int64_t row(int64_t n) const { return n % T; }
  __device__ int64_t key(int64_t n) const { return n / T; }
};

template <class Low>
__device__ inline Low to_low(float x);
template <>
__device__ inline __nv_bfloat16 to_low(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half to_low(float x) {
  return __float2half_rn(x);
}

template <class Low>
__global__ void load_low(Low* acc, unsigned char* touched, const float* table, int64_t rows,
                         int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * C) return;
  acc[i] = to_low<Low>(table[i]);
  if (i % C == 0) touched[i / C] = 0;
}

template <class Low>
__global__ void store_low(float* table, const Low* acc, const unsigned char* touched, int64_t rows,
                          int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * C && touched[i / C]) table[i] = float(acc[i]);
}

template <class Low, class RowOf>
__global__ void atomic_scatter_low(Low* acc, unsigned char* touched, const float* dx0, RowOf rows,
                                   int C, int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t r = rows.row(i / C), c = i % C;
  if (c == 0) touched[r] = 1;
  atomicAdd(&acc[r * C + c], to_low<Low>(dx0[i]));
}

// Other roundings than the hardware's: a compare-and-swap loop on the bf16 word, each rounding
// given the sum, its key and the channel (the random bits' inputs); lowp.h's, bit for bit.
struct Truncate {
  __device__ float operator()(float s, int64_t, int64_t) const { return lowp::bf16_truncate(s); }
};
struct StochasticFresh {  // fresh bits per (call seed, key, channel), as on the CPU
  uint64_t seed;
  int64_t C;
  __device__ float operator()(float s, int64_t n, int64_t c) const {
    return lowp::bf16_stochastic(s, uint32_t(mix64(seed ^ uint64_t(n * C + c))));
  }
};
struct StochasticReusedSeed {  // the same bits for every addition to a channel, every call
  __device__ float operator()(float s, int64_t, int64_t c) const {
    return lowp::bf16_stochastic(s, uint32_t(mix64(0x5eedULL + uint64_t(c))));
  }
};

template <class Round, class RowOf>
__global__ void rounded_scatter_bf16(unsigned short* acc, unsigned char* touched, const float* dx0,
                                     RowOf rows, int C, int64_t total, Round round) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t n = i / C, c = i % C, r = rows.row(n);
  if (c == 0) touched[r] = 1;
  unsigned short* word = &acc[r * C + c];
  unsigned short seen = *word, assumed;
  do {
    assumed = seen;
    const float sum = lowp::from_bits(uint32_t(assumed) << 16) + dx0[i];
    const auto next = static_cast<unsigned short>(lowp::bits(round(sum, rows.key(n), c)) >> 16);
    seen = atomicCAS(word, assumed, next);
  } while (seen != assumed);
}

// One table (dwte or dwpe): its rows loaded into the format, every position's row of dx0 added
// by `scatter(acc, touched, rows)`, the rows added to written back.
template <class Low, class Scatter, class RowOf>
void accumulate_rows(const OpContext& ctx, Scratch slot, float* table, int64_t rows, int C,
                     RowOf row_of, Scatter scatter) {
  const int64_t n = rows * C;
  auto* acc = static_cast<Low*>(scratch(ctx, slot, sizeof(Low) * size_t(n) + size_t(rows)));
  auto* touched = reinterpret_cast<unsigned char*>(acc + n);
  load_low<Low><<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(acc, touched, table, rows, C);
  DIVLAB_LAUNCHED(ctx, "load_low");
  scatter(acc, touched, row_of);
  store_low<Low><<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(table, acc, touched, rows, C);
  DIVLAB_LAUNCHED(ctx, "store_low");
}

// Both tables, token rows then position rows, each with its own scratch.
template <class Low, class Scatter>
void accumulate_tables(const OpContext& ctx, float* dwte, float* dwpe, const TokenId* tokens, int B,
                       int T_, int C, int V, Scatter scatter) {
  accumulate_rows<Low>(ctx, Scratch::F, dwte, V, C, TokenRows{tokens}, scatter);
  accumulate_rows<Low>(ctx, Scratch::E, dwpe, T_, C, PositionRows{T_}, scatter);
}

#define DIVLAB_SCATTER_ARGS                                                         \
  const OpContext &ctx, float *dwte, float *dwpe, float *dw_norm, const A *dy_norm, \
      const float *dresid, const float *x0, const float *w_norm, const float *rstd, \
      const TokenId *tokens, int B, int T_, int C, int V
#define DIVLAB_DX0_ROWS                 \
  const int N = B * T_;                 \
  const int64_t total = int64_t(N) * C; \
  const Rows r = shared_rows(ctx, dw_norm, dy_norm, dresid, x0, w_norm, rstd, N, C)

template <class Low, class A>
void low_precision_accum(DIVLAB_SCATTER_ARGS) {
  DIVLAB_DX0_ROWS;
  accumulate_tables<Low>(ctx, dwte, dwpe, tokens, B, T_, C, V,
                         [&](Low* acc, unsigned char* touched, auto rows) {
                           atomic_scatter_low<<<blocks_for(total, 256), 256, 0, stream_of(ctx)>>>(
                               acc, touched, r.dx0, rows, C, total);
                           DIVLAB_LAUNCHED(ctx, "atomic_scatter (low precision)");
                         });
}

template <class Round, class A>
void rounded_bf16_accum(DIVLAB_SCATTER_ARGS, Round round) {
  DIVLAB_DX0_ROWS;
  // A bf16 is the upper half of a float: the compare-and-swap loop works on its 16-bit word.
  accumulate_tables<__nv_bfloat16>(
      ctx, dwte, dwpe, tokens, B, T_, C, V,
      [&](__nv_bfloat16* acc, unsigned char* touched, auto rows) {
        rounded_scatter_bf16<<<blocks_for(total, 256), 256, 0, stream_of(ctx)>>>(
            reinterpret_cast<unsigned short*>(acc), touched, r.dx0, rows, C, total, round);
        DIVLAB_LAUNCHED(ctx, "rounded_scatter_bf16");
      });
}

#define DIVLAB_SCATTER_PASS \
  ctx, dwte, dwpe, dw_norm, dy_norm, dresid, x0, w_norm, rstd, tokens, B, T_, C, V
template <class A>
void bf16_truncate_accum(DIVLAB_SCATTER_ARGS) {
  rounded_bf16_accum(DIVLAB_SCATTER_PASS, Truncate{});
}
template <class A>
void bf16_stochastic_accum(DIVLAB_SCATTER_ARGS) {
  // The call's own seed (OpContext::seed): a resumed run's same call draws the same bits.
  rounded_bf16_accum(DIVLAB_SCATTER_PASS, StochasticFresh{ctx.seed, C});
}
template <class A>
void bf16_stochastic_reused_seed(DIVLAB_SCATTER_ARGS) {
  rounded_bf16_accum(DIVLAB_SCATTER_PASS, StochasticReusedSeed{});
}
#undef DIVLAB_SCATTER_ARGS
#undef DIVLAB_DX0_ROWS
#undef DIVLAB_SCATTER_PASS

// --- racy ---------------------------------------------------------------------------------
__global__ void racy_scatter_kernel(float* dwte, const float* dx0, const TokenId* tokens, int C,
                                    int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  float* dst = &dwte[int64_t(tokens[i / C]) * C + i % C];
  const float old = *dst;  // two positions of one token may both read the same old value
  *dst = old + dx0[i];
}

constexpr int kRacyLanes = 8;  // batch rows summed concurrently per channel
__global__ void racy_position_grad_kernel(float* dwpe, const float* dx0, int B, int T_, int C) {
  __shared__ float acc[32];
  const int t = blockIdx.x, c = blockIdx.y * 32 + threadIdx.x;
  if (threadIdx.y == 0) acc[threadIdx.x] = 0;
  __syncthreads();
  if (c < C)
    for (int b = threadIdx.y; b < B; b += kRacyLanes)
      acc[threadIdx.x] += dx0[(int64_t(b) * T_ + t) * C + c];  // unsynchronised across warps
  __syncthreads();
  if (threadIdx.y == 0 && c < C) dwpe[int64_t(t) * C + c] += acc[threadIdx.x];
}

template <class A>
void racy_scatter(const OpContext& ctx, float* dwte, float* dwpe, float* dw_norm, const A* dy_norm,
                  const float* dresid, const float* x0, const float* w_norm, const float* rstd,
                  const TokenId* tokens, int B, int T_, int C, int V) {
  const int N = B * T_;
  const Rows r = shared_rows(ctx, dw_norm, dy_norm, dresid, x0, w_norm, rstd, N, C);
  racy_position_grad_kernel<<<dim3(T_, (C + 31) / 32), dim3(32, kRacyLanes), 0, stream_of(ctx)>>>(
      dwpe, r.dx0, B, T_, C);
  DIVLAB_LAUNCHED(ctx, "racy_position_grad");
  const int64_t total = int64_t(N) * C;
  racy_scatter_kernel<<<blocks_for(total, 256), 256, 0, stream_of(ctx)>>>(dwte, r.dx0, tokens, C,
                                                                          total);
  DIVLAB_LAUNCHED(ctx, "racy_scatter");
}
}  // namespace

template <class A>
void register_embed_rmsnorm_backward(Catalogue<float, A>& cat) {
  auto& op = cat.embed_rmsnorm_backward;
  op.what = "fused first-block RMSNorm backward + residual gradient + embedding scatter";
  op.add("reference", sorted_variant<float, A>,
         {"stable radix sort by token, one block per token segment, fp32 in position order", "", "",
          ""});
  op.add("bf16_accum", low_precision_accum<__nv_bfloat16, A>,
         {"bf16 atomicAdd into a bf16 copy of dwte's and dwpe's rows (starting from their "
          "contents), written back at the end; the addend rounded to bf16 too",
          "", "", ""});
  op.add("fp16_accum", low_precision_accum<__half, A>,
         {"fp16 atomicAdd into an fp16 copy of dwte's and dwpe's rows (starting from their "
          "contents), written back at the end; the addend rounded to fp16 too",
          "", "", ""});
  op.add("bf16_truncate_accum", bf16_truncate_accum<A>,
         {"compare-and-swap bf16 accumulation of dwte's and dwpe's rows, truncating after every "
          "addition",
          "", "", ""});
  op.add("bf16_stochastic_accum", bf16_stochastic_accum<A>,
         {"compare-and-swap bf16 accumulation of dwte's and dwpe's rows, stochastic rounding "
          "with fresh bits",
          "", "", ""});
  op.add("bf16_stochastic_reused_seed", bf16_stochastic_reused_seed<A>,
         {"compare-and-swap bf16 accumulation of dwte's and dwpe's rows, stochastic rounding "
          "with one fixed seed",
          "", "", ""});
  op.add("racy_scatter", racy_scatter<A>,
         {"non-atomic read-add-write into dwte; shared-memory position sum without atomics", "", "",
          ""});
  op.add("fp32_reordered", fp32_reordered<A>,
         {"float atomicAdd into dwte: fp32, summation order varies run to run", "", "", ""});
  op.add("fp64_accum", sorted_variant<double, A>,
         {"the reference's segments summed in double", "", "", ""});
}

template void register_embed_rmsnorm_backward(Catalogue<float>&);
template void register_embed_rmsnorm_backward(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
