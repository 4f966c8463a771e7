// Fused softmax + cross-entropy over V classes per row, with its gradient.
#pragma once
#include "kernels/registry.h"

namespace divlab {
template <class T>
void cross_entropy_reference(T* losses, T* dlogits, const T* logits, const TokenId* targets, int N,
                             int V, T dloss);
template <class T>
void register_cross_entropy(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_cross_entropy_variants(Catalogue<T>& cat);
}  // namespace divlab
