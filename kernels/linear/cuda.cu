// Linear layers on the GPU through cuBLAS. Row-major [N, in] activations and [out, in] weights
// are column-major [in, N] and [in, out] to cuBLAS, so y^T = W^T' x^T needs no copies. Operands
// and outputs are A (fp32 mode: float; bf16 mode: bf16 on the tensor cores), accumulation fp32,
// and the weight gradient goes straight into its fp32 buffer.
#include "kernels/common/lowp.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
template <class A>
void linear_forward(const OpContext& ctx, A* y, const A* x, const A* W, int N, int in, int out) {
  // y^T[out, N] = (W as [in, out])^T * x^T[in, N]
  gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, 1.0f, W, in, x, in, 0.0f, y, out);
}

template <class A>
void linear_backward(const OpContext& ctx, A* dx, float* dW, const A* dy, const A* x, const A* W,
                     int N, int in, int out) {
  // dx^T[in, N] = (W as [in, out]) * dy^T[out, N]
  gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, in, N, out, 1.0f, W, in, dy, out, 0.0f, dx, in);
  // dW^T[in, out] += x^T[in, N] * (dy^T[out, N])^T
  gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, in, out, N, 1.0f, x, in, dy, out, 1.0f, dW, in);
}
// --- candidates (kernels/linear/variants.cpp documents them) ----------------------------------
constexpr int kFeatureBlock = 32;

// The GEMM over whole blocks of 32 output features only: y's last out % 32 columns are never
// written.
template <class A>
void tail_skip(const OpContext& ctx, A* y, const A* x, const A* W, int N, int in, int out) {
  const int covered = out / kFeatureBlock * kFeatureBlock;
  if (covered == 0) return;
  gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, covered, N, in, 1.0f, W, in, x, in, 0.0f, y, out);
}

template <bool truncate>
__global__ void round_to_bf16(float* out, const float* in, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = truncate ? lowp::bf16_truncate(in[i]) : lowp::bf16_rne(in[i]);
}

// x and W rounded to bf16 values (kept in fp32 buffers), then the fp32 GEMM: its products of
// bf16 values are exact, so it computes the CPU variant's result. fp32 mode only: in bf16 mode
// the operands are bf16 already (rounded to nearest), which leaves nothing to truncate.
template <bool truncate>
void bf16_inputs(const OpContext& ctx, float* y, const float* x, const float* W, int N, int in,
                 int out) {
  const int64_t nx = int64_t(N) * in, nw = int64_t(out) * in;
  float* xb = scratch_as<float>(ctx, Scratch::A, size_t(nx));
  float* Wb = scratch_as<float>(ctx, Scratch::B, size_t(nw));
  round_to_bf16<truncate><<<blocks_for(nx, 256), 256, 0, stream_of(ctx)>>>(xb, x, nx);
  DIVLAB_LAUNCHED(ctx, "round_to_bf16 (x)");
  round_to_bf16<truncate><<<blocks_for(nw, 256), 256, 0, stream_of(ctx)>>>(Wb, W, nw);
  DIVLAB_LAUNCHED(ctx, "round_to_bf16 (W)");
  linear_forward<float>(ctx, y, xb, Wb, N, in, out);
}
}  // namespace

template <class A>
void register_linear(Catalogue<float, A>& cat) {
  cat.linear_forward.what = "y = x W^T (no bias)";
  cat.linear_backward.what = "dx = dy W, dW += dy^T x";
  const char* how = std::is_same_v<A, bf16>
                        ? "cuBLAS, bf16 operands and output on tensor cores, fp32 accumulation"
                        : "cuBLAS SGEMM, fp32 FMA (no TF32)";
  cat.linear_forward.add("reference", linear_forward<A>, {how, "", "", ""});
  cat.linear_backward.add("reference", linear_backward<A>,
                          {std::string(how) + "; dW accumulated into fp32", "", "", ""});
  cat.linear_forward.add("tail_skip", tail_skip<A>,
                         {"cuBLAS over the first out / 32 * 32 output features only", "", "", ""});
  if constexpr (std::is_same_v<A, float>) {
    cat.linear_forward.add("bf16_truncate", bf16_inputs<true>,
                           {"x and W truncated to bf16 by a kernel, then cuBLAS", "", "", ""});
    cat.linear_forward.add(
        "bf16_rne", bf16_inputs<false>,
        {"x and W rounded to nearest bf16 by a kernel, then cuBLAS", "", "", ""});
  }
}

template void register_linear(Catalogue<float>&);
template void register_linear(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
