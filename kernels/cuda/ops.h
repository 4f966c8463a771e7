// The CUDA backend's catalogue: every op's deterministic reference on the GPU, and the GPU
// versions of the candidate variants. Each op's kernels live beside its CPU reference
// (kernels/<op>/cuda.cu); this header only wires them together.
#pragma once

#include "kernels/registry.h"

namespace divlab::cuda {

// How the GEMMs (linear layers and the attention products) compute.
//   Fp32: fp32 inputs, fp32 FMA (no TF32), for parity with the CPU at 1e-4.
//   Bf16: inputs rounded to bf16 on the tensor cores, fp32 accumulation and fp32 outputs
//         (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF): the mixed-precision training mode.
enum class GemmMode { Fp32, Bf16 };

const Catalogue<float>& catalogue(GemmMode mode);
Catalogue<float>& mutable_catalogue(GemmMode mode);  // for plug-in variants

void register_embedding(Catalogue<float>& cat);
void register_rmsnorm(Catalogue<float>& cat);
void register_linear(Catalogue<float>& cat, GemmMode mode);
void register_attention(Catalogue<float>& cat, GemmMode mode);
void register_elementwise(Catalogue<float>& cat);
void register_cross_entropy(Catalogue<float>& cat);
void register_embed_rmsnorm_backward(Catalogue<float>& cat);
void register_optimizer(Catalogue<float>& cat);

// Shared by rmsnorm and embed_rmsnorm_backward: per row n,
//   dx[n] (+)= rstd w dy - x rstd^3 / C * sum(dy w x)   and   prod[n] = dy * x * rstd
// (prod feeds the norm weight's gradient). `accumulate` adds into dx instead of overwriting.
void rmsnorm_backward_rows(float* dx, float* prod, const float* dy, const float* x, const float* w,
                           const float* rstd, int N, int C, bool accumulate, const float* dresid);

}  // namespace divlab::cuda
