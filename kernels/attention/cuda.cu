// Causal multi-head attention on the GPU as batched cuBLAS GEMMs around a causal softmax:
// q, k, v are gathered into [B, NH, T, hs] (contiguous per head), scores = scale q k^T, softmax
// with the causal mask into att [B, NH, T, T] (saved for the backward, like the CPU reference),
// y = att v, and y scattered back to [N, C]. No atomics: bitwise deterministic.
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
// Between a row-major [N, stride] tensor, whose columns col0 .. col0 + C hold NH heads, and a
// per-head [B, NH, T, hs] layout. qkv: stride 3C, col0 = 0, C, 2C for q, k, v; out: stride C.
template <bool to_heads>
__global__ void permute_kernel(float* heads, float* rows, int stride, int col0, int T_, int C,
                               int NH, int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int hs = C / NH;
  const int d = int(i % hs);
  const int64_t t = (i / hs) % T_;
  const int64_t h = (i / (int64_t(hs) * T_)) % NH;
  const int64_t b = i / (int64_t(hs) * T_ * NH);
  const int64_t j = (b * T_ + t) * stride + col0 + h * hs + d;
  if (to_heads)
    heads[i] = rows[j];
  else
    rows[j] = heads[i];
}

template <bool to_heads>
void permute(float* heads, const float* rows, int stride, int col0, int B, int T_, int C, int NH,
             const char* what) {
  const int64_t total = int64_t(B) * T_ * C;
  // Only the destination is written: `rows` when scattering back, `heads` when gathering.
  permute_kernel<to_heads><<<blocks_for(total, 256), 256>>>(heads, const_cast<float*>(rows), stride,
                                                            col0, T_, C, NH, total);
  DIVLAB_LAUNCHED(what);
}

void gather_qkv(float* q, float* k, float* v, const float* qkv, int B, int T_, int C, int NH) {
  permute<true>(q, qkv, 3 * C, 0, B, T_, C, NH, "attention gather q");
  permute<true>(k, qkv, 3 * C, C, B, T_, C, NH, "attention gather k");
  permute<true>(v, qkv, 3 * C, 2 * C, B, T_, C, NH, "attention gather v");
}

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

template <GemmMode mode, int lookahead, bool subtract_max>
void attention_forward(float* out, float* att, const float* qkv, int B, int T_, int C, int NH) {
  const int hs = C / NH, BH = B * NH;
  const size_t n = size_t(B) * T_ * C;
  float *q = scratch_as<float>(Scratch::B, n), *k = scratch_as<float>(Scratch::C, n),
        *v = scratch_as<float>(Scratch::D, n), *y = scratch_as<float>(Scratch::E, n);
  gather_qkv(q, k, v, qkv, B, T_, C, NH);
  const long long head = (long long)T_ * hs, square = (long long)T_ * T_;
  // att^T[s, t] (column-major) = scale sum_d k[s, d] q[t, d]: row-major att[t, s]
  gemm_batched<mode>(CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, 1.0f / sqrtf(float(hs)), k, hs, head, q,
                     hs, head, 0.0f, att, T_, square, BH);
  const int64_t rows = int64_t(BH) * T_;
  causal_softmax_kernel<lookahead, subtract_max><<<blocks_for(rows, 8), 256>>>(att, T_, rows);
  DIVLAB_LAUNCHED("causal_softmax");
  // y^T[d, t] = sum_s v[s, d] att[t, s]
  gemm_batched<mode>(CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, v, hs, head, att, T_, square, 0.0f,
                     y, hs, head, BH);
  permute<false>(y, out, C, 0, B, T_, C, NH, "attention merge_heads");
}

template <GemmMode mode>
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T_, int C, int NH) {
  const int hs = C / NH, BH = B * NH;
  const size_t n = size_t(B) * T_ * C;
  const long long head = (long long)T_ * hs, square = (long long)T_ * T_;
  float *q = scratch_as<float>(Scratch::B, n), *k = scratch_as<float>(Scratch::C, n),
        *v = scratch_as<float>(Scratch::D, n), *dy = scratch_as<float>(Scratch::E, n);
  float *dq = scratch_as<float>(Scratch::G, n), *dk = scratch_as<float>(Scratch::H, n),
        *dv = scratch_as<float>(Scratch::I, n);
  float* datt = scratch_as<float>(Scratch::F, size_t(BH) * T_ * T_);
  gather_qkv(q, k, v, qkv, B, T_, C, NH);
  permute<true>(dy, dout, C, 0, B, T_, C, NH, "attention split_heads");
  // datt[t, s] = sum_d dy[t, d] v[s, d]
  gemm_batched<mode>(CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, 1.0f, v, hs, head, dy, hs, head, 0.0f,
                     datt, T_, square, BH);
  // dv[s, d] = sum_t att[t, s] dy[t, d]
  gemm_batched<mode>(CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, dy, hs, head, att, T_, square,
                     0.0f, dv, hs, head, BH);
  const int64_t rows = int64_t(BH) * T_;
  softmax_backward_kernel<<<blocks_for(rows, 8), 256>>>(datt, att, T_, rows,
                                                        1.0f / sqrtf(float(hs)));
  DIVLAB_LAUNCHED("softmax_backward");
  // dq[t, d] = sum_s dpre[t, s] k[s, d];  dk[s, d] = sum_t dpre[t, s] q[t, d]
  gemm_batched<mode>(CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, k, hs, head, datt, T_, square,
                     0.0f, dq, hs, head, BH);
  gemm_batched<mode>(CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, q, hs, head, datt, T_, square,
                     0.0f, dk, hs, head, BH);
  permute<false>(dq, dqkv, 3 * C, 0, B, T_, C, NH, "attention scatter dq");
  permute<false>(dk, dqkv, 3 * C, C, B, T_, C, NH, "attention scatter dk");
  permute<false>(dv, dqkv, 3 * C, 2 * C, B, T_, C, NH, "attention scatter dv");
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
