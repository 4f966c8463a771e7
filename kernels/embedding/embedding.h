// embedding_forward: x[b, t] = wte[tokens[b, t]] + wpe[t]. Its backward is part of the fused
// embed_rmsnorm_backward op (kernels/embed_rmsnorm_backward/).
#pragma once
#include "kernels/registry.h"

namespace divlab {
template <class T>
void embedding_forward_reference(T* x, const TokenId* tokens, const T* wte, const T* wpe, int B,
                                 int T_, int C, int V);
template <class T>
void register_embedding(Catalogue<T>& cat);
}  // namespace divlab
