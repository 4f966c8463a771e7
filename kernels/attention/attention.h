// Causal multi-head self-attention on a packed qkv[N, 3C] tensor, softmax(q k^T / sqrt(hs)) v.
#pragma once
#include "kernels/registry.h"

namespace divlab {
// The forward with two knobs the variants turn: how far past itself each position may look
// (0 = causal) and whether the softmax subtracts the row max. The reference is (0, true).
template <class T>
void attention_forward_with(T* out, T* att, const T* qkv, int B, int T_, int C, int NH,
                            int lookahead, bool subtract_max);
template <class T>
void attention_forward_reference(T* out, T* att, const T* qkv, int B, int T_, int C, int NH);
template <class T>
void attention_backward_reference(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int T_,
                                  int C, int NH);
template <class T>
void register_attention(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_attention_variants(Catalogue<T>& cat);
}  // namespace divlab
