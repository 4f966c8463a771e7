// Causal scaled-dot-product attention through cuDNN's fused SDPA engines, built with the graph
// (backend) API as the composite graphs cuDNN's runtime fusion recognises:
//   forward:  S = Q K^T, S *= 1/sqrt(hd), causal mask (row index >= column index, else -inf),
//             softmax with its row statistics L = max + log(sum exp), O = P V
//   backward: the flash-attention backward that recomputes P = exp(S - L) tile by tile:
//             D = rowsum(dO * O), dV = P^T dO, dS = P (dO V^T - D) / sqrt(hd), dK = dS^T Q,
//             dQ = dS K
// Operands are bf16 (the fused engines take no fp32), statistics fp32, accumulation fp32. Q, K
// and V are read straight out of the [N, 3C] qkv rows and O, dO live in [N, C] rows: the graph's
// strides address each head in place.
#pragma once

#include <cuda_bf16.h>

#include <string>
#include <vector>

#include "kernels/op_context.h"

namespace divlab::cuda {

// Why cuDNN's SDPA cannot run this shape ("" when it can): head size a multiple of 8 and at
// most 128 (the fused engines' limit, and 16-byte aligned head offsets); for the backward on
// cuDNN before 9.16 also T a multiple of 128 (shorter tiles need a padding mask there).
std::string cudnn_sdpa_unsupported(int T_, int C, int NH, bool backward);

// o[N, C], stats[B, NH, T] (log-sum-exp of each scaled, masked score row) from qkv[N, 3C].
void cudnn_sdpa_forward(const OpContext& ctx, __nv_bfloat16* o, float* stats,
                        const __nv_bfloat16* qkv, int B, int T_, int C, int NH);

// dqkv[N, 3C] (overwritten) from qkv, the forward's o and stats, and dout[N, C].
void cudnn_sdpa_backward(const OpContext& ctx, __nv_bfloat16* dqkv, const __nv_bfloat16* qkv,
                         const __nv_bfloat16* o, const float* stats, const __nv_bfloat16* dout,
                         int B, int T_, int C, int NH);

// Whether the backward plan for this shape runs on an engine cuDNN calls deterministic (no
// float atomics in dQ); builds the plan if needed. The engine's name goes to *engine.
bool cudnn_sdpa_backward_deterministic(int B, int T_, int C, int NH, std::string* engine);

// For benchmarks (bench/sdpa_engines.cu): every configuration cuDNN's heuristics (modes A, B and
// fallback) offer for this shape's forward or backward graph, in the order the op's plan is
// chosen from (the first is the op's), each run on random inputs: whether it gives the first's
// bits, and its mean time over `reps` calls on ctx's stream.
struct SdpaCandidate {
  std::string engine;
  bool deterministic = false;  // no NONDETERMINISTIC note and, backward, dQ without atomics
  bool same_bits = false;
  double ms = 0;
};
std::vector<SdpaCandidate> cudnn_sdpa_candidates(const OpContext& ctx, bool backward, int B, int T_,
                                                 int C, int NH, int reps);

}  // namespace divlab::cuda
