// Linear layers on the GPU through cuBLAS. Row-major [N, in] activations and [out, in] weights
// are column-major [in, N] and [in, out] to cuBLAS, so y^T = W^T' x^T needs no copies.
#include "kernels/common/lowp.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
template <GemmMode mode>
void linear_forward(float* y, const float* x, const float* W, int N, int in, int out) {
  // y^T[out, N] = (W as [in, out])^T * x^T[in, N]
  gemm<mode>(CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, 1.0f, W, in, x, in, 0.0f, y, out);
}

template <GemmMode mode>
void linear_backward(float* dx, float* dW, const float* dy, const float* x, const float* W, int N,
                     int in, int out) {
  // dx^T[in, N] = (W as [in, out]) * dy^T[out, N]
  gemm<mode>(CUBLAS_OP_N, CUBLAS_OP_N, in, N, out, 1.0f, W, in, dy, out, 0.0f, dx, in);
  // dW^T[in, out] += x^T[in, N] * (dy^T[out, N])^T
  gemm<mode>(CUBLAS_OP_N, CUBLAS_OP_T, in, out, N, 1.0f, x, in, dy, out, 1.0f, dW, in);
}
// --- candidates (kernels/linear/variants.cpp documents them) ----------------------------------
constexpr int kFeatureBlock = 32;

// The GEMM over whole blocks of 32 output features only: y's last out % 32 columns are never
// written.
template <GemmMode mode>
void tail_skip(float* y, const float* x, const float* W, int N, int in, int out) {
  const int covered = out / kFeatureBlock * kFeatureBlock;
  if (covered == 0) return;
  gemm<mode>(CUBLAS_OP_T, CUBLAS_OP_N, covered, N, in, 1.0f, W, in, x, in, 0.0f, y, out);
}

template <bool truncate>
__global__ void round_to_bf16(float* out, const float* in, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = truncate ? lowp::bf16_truncate(in[i]) : lowp::bf16_rne(in[i]);
}

// x and W rounded to bf16 values (kept in fp32 buffers), then the mode's GEMM: its products of
// bf16 values are exact, so both modes compute the CPU variant's result.
template <GemmMode mode, bool truncate>
void bf16_inputs(float* y, const float* x, const float* W, int N, int in, int out) {
  const int64_t nx = int64_t(N) * in, nw = int64_t(out) * in;
  float* xb = scratch_as<float>(Scratch::A, size_t(nx));
  float* Wb = scratch_as<float>(Scratch::B, size_t(nw));
  round_to_bf16<truncate><<<blocks_for(nx, 256), 256>>>(xb, x, nx);
  DIVLAB_LAUNCHED("round_to_bf16 (x)");
  round_to_bf16<truncate><<<blocks_for(nw, 256), 256>>>(Wb, W, nw);
  DIVLAB_LAUNCHED("round_to_bf16 (W)");
  linear_forward<mode>(y, xb, Wb, N, in, out);
}

template <GemmMode mode>
void register_candidates(Catalogue<float>& cat) {
  cat.linear_forward.add("tail_skip", tail_skip<mode>,
                         {"cuBLAS over the first out / 32 * 32 output features only", "", "", ""});
  cat.linear_forward.add("bf16_truncate", bf16_inputs<mode, true>,
                         {"x and W truncated to bf16 by a kernel, then cuBLAS", "", "", ""});
  cat.linear_forward.add("bf16_rne", bf16_inputs<mode, false>,
                         {"x and W rounded to nearest bf16 by a kernel, then cuBLAS", "", "", ""});
}
}  // namespace

void register_linear(Catalogue<float>& cat, GemmMode mode) {
  cat.linear_forward.what = "y = x W^T (no bias)";
  cat.linear_backward.what = "dx = dy W, dW += dy^T x";
  if (mode == GemmMode::Fp32) {
    cat.linear_forward.add("reference", linear_forward<GemmMode::Fp32>,
                           {"cuBLAS SGEMM, fp32 FMA (no TF32)", "", "", ""});
    cat.linear_backward.add("reference", linear_backward<GemmMode::Fp32>,
                            {"cuBLAS SGEMM, fp32 FMA (no TF32)", "", "", ""});
    register_candidates<GemmMode::Fp32>(cat);
  } else {
    cat.linear_forward.add("reference", linear_forward<GemmMode::Bf16>,
                           {"cuBLAS, bf16 tensor cores, fp32 accumulation", "", "", ""});
    cat.linear_backward.add("reference", linear_backward<GemmMode::Bf16>,
                            {"cuBLAS, bf16 tensor cores, fp32 accumulation", "", "", ""});
    register_candidates<GemmMode::Bf16>(cat);
  }
}

}  // namespace divlab::cuda
