// Causal multi-head attention on the GPU as batched cuBLAS GEMMs around a causal softmax:
// scores = scale q k^T, softmax with the causal mask into att [B, NH, T, T] (saved for the
// backward, like the CPU reference), y = att v. The GEMMs address each head in place (q, k, v
// as column blocks of the [N, 3C] qkv rows, y as column blocks of the [N, C] output; gemm_heads),
// so nothing is gathered or scattered. No atomics: bitwise deterministic.
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

template <GemmMode mode>
void register_modes(Catalogue<float>& cat, const char* how) {
  cat.attention_forward.add(
      "reference", attention_forward<mode, 0, true>,
      {std::string("batched cuBLAS GEMMs (") + how + ") around a warp-per-row causal softmax", "",
       "", ""});
  cat.attention_forward.add("mask_off_by_one", attention_forward<mode, 1, true>,
                            {"causal mask off by one: position i attends to 0..i+1", "", "", ""});
  cat.attention_forward.add("no_max_subtraction", attention_forward<mode, 0, false>,
                            {"softmax without subtracting the row max", "", "", ""});
  cat.attention_backward.add(
      "reference", attention_backward<mode>,
      {std::string("batched cuBLAS GEMMs (") + how + ") around a warp-per-row softmax backward", "",
       "", ""});
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
