// embed_rmsnorm_backward: the fused op the reported candidate kernel replaced.
//
// It finishes the backward pass at the bottom of the network: the first block's RMSNorm backward,
// plus the residual-stream gradient, gives dx0 (the gradient of the embedding output); dx0 is then
// scattered into the token-embedding gradient (one row per token id) and summed into the position
// embedding gradient. A frequent token's row collects one contribution per occurrence in the batch
// -- thousands of them per step on real text -- which is where low-precision accumulation fails.
#pragma once
#include <atomic>
#include <vector>

#include "kernels/registry.h"

namespace divlab {

template <class T>
void embed_rmsnorm_backward_reference(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm,
                                      const T* dresid, const T* x0, const T* w_norm, const T* rstd,
                                      const TokenId* tokens, int B, int T_, int C, int V);

// Shared first half: dx0 = dresid + rmsnorm_backward(dy_norm) per row, and dw_norm += ....
// Returns dx0 as a new [N, C] buffer. Variants of the scatter reuse it unchanged.
template <class T>
std::vector<T> embed_rmsnorm_dx0(T* dw_norm, const T* dy_norm, const T* dresid, const T* x0,
                                 const T* w_norm, const T* rstd, int N, int C);

// dwpe[t] += sum_b dx0[b, t], in batch order.
template <class T>
void position_grad(T* dwpe, const T* dx0, int B, int T_, int C);

template <class T>
void register_embed_rmsnorm_backward(Catalogue<T>& cat);
// The candidate variants (variants.cpp): the seed bug, its relatives, and two benign controls.
template <class T>
void register_embed_rmsnorm_backward_variants(Catalogue<T>& cat);
}  // namespace divlab
