// The CUDA backend's catalogues: every op's deterministic reference on the GPU, and the GPU
// versions of the candidate variants, in two modes. Each op's kernels live beside its CPU
// reference (kernels/<op>/cuda.cu); this header only wires them together.
#pragma once

#include "kernels/bf16_activations.h"
#include "kernels/common/lowp.h"
#include "kernels/fp16_activations.h"
#include "kernels/registry.h"

namespace divlab {
struct DeviceComparison;
}

namespace divlab::cuda {

// Shadow mode's comparison on the GPU (shadow.reference = "fp32_device"; kernels/shadow.h).
const DeviceComparison& shadow_comparison();

// Two modes, differing in the activation storage type A (kernels/ops.h) and the GEMMs with it:
//   fp32 (A = float): fp32 operands, fp32 FMA (no TF32), for parity with the CPU at 1e-4.
//   bf16 (A = bf16):  activations and the weights' working copy stored in bf16, GEMMs on bf16
//                     tensor cores with fp32 accumulation; master weights, gradients, optimizer
//                     state and the residual stream stay fp32: the mixed-precision training mode.
const Catalogue<float>& catalogue();               // fp32 mode
Catalogue<float>& mutable_catalogue();             // for plug-in variants (fp32 ABI)
const Catalogue<float, bf16>& bf16_catalogue();    // bf16 mode
Catalogue<float, bf16>& mutable_bf16_catalogue();  // for plug-in variants (adapted)

// Device conversions between fp32 scratch and bf16 activations (the plug-in adapters'), on
// `stream`.
void widen_bf16(void* stream, float* out, const bf16* in, int64_t n);
void round_to_bf16(void* stream, bf16* out, const float* in, int64_t n);
const Bf16Conversions& bf16_conversions();
// ... and between fp32 activations and the fp16 copies of fp16 plug-in kernels.
void narrow_to_fp16(void* stream, fp16* out, const float* in, int64_t n);
void widen_fp16(void* stream, float* out, const fp16* in, int64_t n);
const Fp16Conversions& fp16_conversions();

// Each op directory's GPU kernels (kernels/<dir>/cuda.cu), registered by catalogue.cu for every
// directory of DIVLAB_OP_DIRECTORIES (kernels/op_list.h).
// Directory names are pasted into function names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_DECLARE_REGISTER(dir) \
  template <class A>                 \
  void register_##dir(Catalogue<float, A>& cat);
DIVLAB_OP_DIRECTORIES(DIVLAB_DECLARE_REGISTER)
#undef DIVLAB_DECLARE_REGISTER
// NOLINTEND(bugprone-macro-parentheses)

// RMSNorm's backward, shared by rmsnorm and embed_rmsnorm_backward: per row n,
//   out[n] = base[n] + rstd w dy - x rstd^3 / C * sum(dy w x)   (out may be base itself)
// and dw += sum_n dy x rstd in a fixed order: one warp per row where C allows
// (kernels/cuda/row_warp.cuh), else one block per row and column sums of the products.
template <class A>
void rmsnorm_backward_onto(const OpContext& ctx, float* out, const float* base, float* dw,
                           const A* dy, const float* x, const float* w, const float* rstd, int N,
                           int C);

// The reference pairs the model runs where their ops are the catalogue's references
// (ReferencePairs, kernels/registry.h), set by catalogue.cu once every directory is registered;
// attention's pair is register_attention's own.
template <class A>
void register_reference_pairs(Catalogue<float, A>& cat);
// rmsnorm_backward, then dresid cast to bf16 into `copy`, in one pass where the row kernel allows
// (kernels/rmsnorm/cuda.cu): the two references' bits.
void rmsnorm_backward_and_cast(const OpContext& ctx, float* dresid, float* dw, const bf16* dy,
                               const float* x, const float* w, const float* rstd, int N, int C,
                               bf16* copy);
// sgd_step writing each updated value's bf16 copy too, as cast would (the pair with the next
// forward's cast of the weights, bf16 mode; kernels/optimizer/cuda.cu); null p_copy: sgd_step.
void sgd_step_and_cast(const OpContext& ctx, float* p, float* buf, const float* g, int64_t n,
                       float lr, float momentum, bool nesterov, float weight_decay,
                       float grad_scale, bf16* p_copy);
// sum_squares over each span (offset, size) of `base` in three launches, each span's sum the bits
// of its own call (kernels/optimizer/cuda.cu).
void sum_squares_spans(const OpContext& ctx, double* out, const float* base,
                       const int64_t* device_spans, const int64_t* host_spans, int count);

}  // namespace divlab::cuda
