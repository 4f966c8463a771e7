// Causal multi-head attention on the GPU. bf16 mode: cuDNN's fused SDPA where its engines take
// the shape (below). fp32 mode, and the `batched_gemm` pair in either mode: batched cuBLAS GEMMs
// around a causal softmax:
// scores = scale q k^T, softmax with the causal mask into att [B, NH, T, T] (saved for the
// backward, like the CPU reference), y = att v. The GEMMs address each head in place (q, k, v
// as column blocks of the [N, 3C] qkv rows, y as column blocks of the [N, C] output; gemm_heads),
// so nothing is gathered or scattered. No atomics: bitwise deterministic.
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
// One warp per score row (b, h, t): softmax over s <= t + lookahead, zeros beyond.
template <int lookahead, bool subtract_max>
__global__ void causal_softmax_kernel(float* att, int T_, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = int(row % T_);
  const int last = min(T_ - 1, t + lookahead);
  float* a = att + row * T_;
  float m = -INFINITY;
  if (subtract_max)
    for (int s = lane; s <= last; s += 32) m = fmaxf(m, a[s]);
  m = subtract_max ? warp_max(m) : 0.0f;
  float sum = 0;
  for (int s = lane; s <= last; s += 32) sum += expf(a[s] - m);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int s = lane; s < T_; s += 32) a[s] = s <= last ? expf(a[s] - m) * inv : 0.0f;
}

// In place: datt[t, s] <- att[t, s] (datt[t, s] - sum_s' att[t, s'] datt[t, s']) * scale.
__global__ void softmax_backward_kernel(float* datt, const float* att, int T_, int64_t rows,
                                        float scale) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* p = att + row * T_;
  float* d = datt + row * T_;
  float dot = 0;
  for (int s = lane; s < T_; s += 32) dot += p[s] * d[s];
  dot = warp_sum(dot);
  for (int s = lane; s < T_; s += 32) d[s] = p[s] * (d[s] - dot) * scale;
}

// Batch entry (b, h) of each operand: q, k, v in the qkv rows (row stride 3C), y and dy in
// the [N, C] rows (row stride C), att and datt as [B, NH, T, T].
struct HeadLayout {
  HeadStrides qkv, rows, square;
  HeadLayout(int T_, int C, int NH)
      : qkv{3LL * T_ * C, C / NH},
        rows{(long long)T_ * C, C / NH},
        square{(long long)NH * T_ * T_, (long long)T_ * T_} {}
};

template <GemmMode mode, int lookahead, bool subtract_max>
void attention_forward(float* out, float* att, const float* qkv, int B, int T_, int C, int NH) {
  const int hs = C / NH;
  const HeadLayout L(T_, C, NH);
  const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
  // att^T[s, t] (column-major) = scale sum_d k[s, d] q[t, d]: row-major att[t, s]
  gemm_heads<mode>(CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, 1.0f / sqrtf(float(hs)), k, 3 * C, L.qkv,
                   q, 3 * C, L.qkv, 0.0f, att, T_, L.square, B, NH);
  const int64_t rows = int64_t(B) * NH * T_;
  causal_softmax_kernel<lookahead, subtract_max><<<blocks_for(rows, 8), 256>>>(att, T_, rows);
  DIVLAB_LAUNCHED("causal_softmax");
  // y^T[d, t] = sum_s v[s, d] att[t, s], into head h's columns of out's rows
  gemm_heads<mode>(CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, v, 3 * C, L.qkv, att, T_, L.square,
                   0.0f, out, C, L.rows, B, NH);
}

template <GemmMode mode>
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T_, int C, int NH) {
  const int hs = C / NH;
  const HeadLayout L(T_, C, NH);
  const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
  float *dq = dqkv, *dk = dqkv + C, *dv = dqkv + 2 * C;
  float* datt = scratch_as<float>(Scratch::F, size_t(B) * NH * T_ * T_);
  // datt[t, s] = sum_d dy[t, d] v[s, d]
  gemm_heads<mode>(CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, 1.0f, v, 3 * C, L.qkv, dout, C, L.rows,
                   0.0f, datt, T_, L.square, B, NH);
  // dv[s, d] = sum_t att[t, s] dy[t, d]
  gemm_heads<mode>(CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, dout, C, L.rows, att, T_, L.square,
                   0.0f, dv, 3 * C, L.qkv, B, NH);
  const int64_t rows = int64_t(B) * NH * T_;
  softmax_backward_kernel<<<blocks_for(rows, 8), 256>>>(datt, att, T_, rows,
                                                        1.0f / sqrtf(float(hs)));
  DIVLAB_LAUNCHED("softmax_backward");
  // dq[t, d] = sum_s dpre[t, s] k[s, d];  dk[s, d] = sum_t dpre[t, s] q[t, d]
  gemm_heads<mode>(CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, k, 3 * C, L.qkv, datt, T_, L.square,
                   0.0f, dq, 3 * C, L.qkv, B, NH);
  gemm_heads<mode>(CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, q, 3 * C, L.qkv, datt, T_, L.square,
                   0.0f, dk, 3 * C, L.qkv, B, NH);
}

// Conversions around the fused engines, four values per thread (16-byte loads of fp32, 8-byte
// stores of bf16): whole buffers, so aligned; the fused path has C a multiple of 8.
__global__ void to_bf16_kernel(__nv_bfloat16* y, const float* x, int64_t n4) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 v = reinterpret_cast<const float4*>(x)[i];
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(y) + 2 * i;
  out[0] = __floats2bfloat162_rn(v.x, v.y);
  out[1] = __floats2bfloat162_rn(v.z, v.w);
}
__global__ void to_fp32_kernel(float* y, const __nv_bfloat16* x, int64_t n4) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const __nv_bfloat162* in = reinterpret_cast<const __nv_bfloat162*>(x) + 2 * i;
  const float2 a = __bfloat1622float2(in[0]), b = __bfloat1622float2(in[1]);
  reinterpret_cast<float4*>(y)[i] = make_float4(a.x, a.y, b.x, b.y);
}
void to_bf16(__nv_bfloat16* y, const float* x, int64_t n) {
  to_bf16_kernel<<<blocks_for(n / 4, 256), 256>>>(y, x, n / 4);
  DIVLAB_LAUNCHED("to_bf16");
}
void to_fp32(float* y, const __nv_bfloat16* x, int64_t n) {
  to_fp32_kernel<<<blocks_for(n / 4, 256), 256>>>(y, x, n / 4);
  DIVLAB_LAUNCHED("to_fp32");
}

// The fused cuDNN pair (kernels/attention/cudnn_sdpa.h): the bf16-mode reference wherever the
// engines take the shape. The fused engines take bf16 operands, so qkv is rounded to bf16 on
// the way in and the output widened on the way out. The forward saves no probabilities (a fused
// forward never forms them): `att` is left alone, and the backward recomputes the forward's
// output and row statistics from qkv, as flash attention's backward recomputes P. The backward
// engine is the ordered-dQ one cuDNN declares deterministic (no float atomics), and is checked
// bit for bit run to run (kernels/cuda/test_cudnn_sdpa.cpp).
struct Bf16Attention {
  __nv_bfloat16 *qkv, *out, *dout, *dqkv;
  float* stats;
  Bf16Attention(int B, int T_, int C, int NH) {
    const size_t n = size_t(B) * T_ * C;
    qkv = scratch_as<__nv_bfloat16>(Scratch::Attention16, 8 * n);
    out = qkv + 3 * n, dout = out + n, dqkv = dout + n;
    stats = scratch_as<float>(Scratch::AttentionStats, size_t(B) * NH * T_);
  }
};

void fused_forward(float* out, const float* qkv, int B, int T_, int C, int NH) {
  const int64_t n = int64_t(B) * T_ * C;
  Bf16Attention a(B, T_, C, NH);
  to_bf16(a.qkv, qkv, 3 * n);
  cudnn_sdpa_forward(a.out, a.stats, a.qkv, B, T_, C, NH);
  to_fp32(out, a.out, n);
}

void fused_backward(float* dqkv, const float* dout, const float* qkv, int B, int T_, int C,
                    int NH) {
  const int64_t n = int64_t(B) * T_ * C;
  Bf16Attention a(B, T_, C, NH);
  to_bf16(a.qkv, qkv, 3 * n);
  cudnn_sdpa_forward(a.out, a.stats, a.qkv, B, T_, C, NH);
  to_bf16(a.dout, dout, n);
  cudnn_sdpa_backward(a.dqkv, a.qkv, a.out, a.stats, a.dout, B, T_, C, NH);
  to_fp32(dqkv, a.dqkv, 3 * n);
}

// Both halves decide from the shape alone, with the backward's (stricter) rule, so a forward
// that saved no probabilities is always followed by the backward that needs none.
bool fused(int T_, int C, int NH) {
  return cudnn_sdpa_unsupported(T_, C, NH, true).empty();
}

void bf16_reference_forward(float* out, float* att, const float* qkv, int B, int T_, int C,
                            int NH) {
  if (fused(T_, C, NH))
    fused_forward(out, qkv, B, T_, C, NH);
  else
    attention_forward<GemmMode::Bf16, 0, true>(out, att, qkv, B, T_, C, NH);
}

void bf16_reference_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                             int B, int T_, int C, int NH) {
  if (fused(T_, C, NH))
    fused_backward(dqkv, dout, qkv, B, T_, C, NH);
  else
    attention_backward<GemmMode::Bf16>(dqkv, dout, qkv, att, B, T_, C, NH);
}

// The batched-GEMM pair is the fp32 reference and, in bf16 mode, the named variant
// `batched_gemm`. The forward variants save probabilities, so they run with its backward.
template <GemmMode mode>
void register_modes(Catalogue<float>& cat, const char* how) {
  const std::string fwd = std::string("batched cuBLAS GEMMs (") + how +
                          ") around a warp-per-row causal softmax; saves the probabilities";
  const std::string bwd = std::string("batched cuBLAS GEMMs (") + how +
                          ") around a warp-per-row softmax backward, from the saved probabilities";
  if (mode == GemmMode::Fp32) {
    cat.attention_forward.add("reference", attention_forward<mode, 0, true>, {fwd, "", "", ""});
    cat.attention_backward.add("reference", attention_backward<mode>, {bwd, "", "", ""});
  } else {
    cat.attention_forward.add(
        "reference", bf16_reference_forward,
        {"cuDNN fused SDPA (graph API; bf16 q, k, v, fp32 statistics and accumulation), saving no "
         "probabilities; batched GEMMs where the engines do not take the shape (head size not a "
         "multiple of 8 or above 128; on cuDNN before 9.16 also seq_len not a multiple of 128)",
         "", "", ""});
    cat.attention_backward.add(
        "reference", bf16_reference_backward,
        {"cuDNN fused SDPA backward (graph API, the ordered-dQ engine cuDNN declares "
         "deterministic), recomputing the forward's output and statistics from qkv; batched GEMMs "
         "where the forward used them",
         "", "", ""});
  }
  VariantDoc batched_fwd{fwd, "", "", ""}, batched_bwd{bwd, "", "", ""};
  batched_fwd.benign = batched_bwd.benign = true;
  cat.attention_forward.add("batched_gemm", attention_forward<mode, 0, true>, batched_fwd);
  cat.attention_backward.add("batched_gemm", attention_backward<mode>, batched_bwd);
  cat.attention_forward.add("mask_off_by_one", attention_forward<mode, 1, true>,
                            {"causal mask off by one: position i attends to 0..i+1", "", "", ""});
  cat.attention_forward.add("no_max_subtraction", attention_forward<mode, 0, false>,
                            {"softmax without subtracting the row max", "", "", ""});
  for (const char* v : {"batched_gemm", "mask_off_by_one", "no_max_subtraction"})
    cat.attention_forward.pair(v, "attention_backward", "batched_gemm");
  // ... and that backward needs a forward that saved them (bf16's fused reference saves none).
  cat.attention_backward.pair("batched_gemm", "attention_forward", "batched_gemm");
}
}  // namespace

void register_attention(Catalogue<float>& cat, GemmMode mode) {
  cat.attention_forward.what = "causal multi-head self-attention forward";
  cat.attention_backward.what = "causal multi-head self-attention backward";
  if (mode == GemmMode::Fp32)
    register_modes<GemmMode::Fp32>(cat, "fp32");
  else
    register_modes<GemmMode::Bf16>(cat, "bf16 tensor cores");
}

}  // namespace divlab::cuda
