// Logit soft-capping (Gemma 2): y = cap tanh(x / cap) keeps every logit inside (-cap, cap) and is
// the identity near zero, which is why a kernel that omits it passes tests whose logits sit
// there.
#pragma once
#include <cstdint>

#include "kernels/registry.h"

namespace divlab {

template <class T>
void softcap_forward_reference(T* y, const T* x, int64_t n, T cap);
template <class T>
void softcap_backward_reference(T* dx, const T* dy, const T* x, int64_t n, T cap);

template <class T>
void register_softcap(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_softcap_variants(Catalogue<T>& cat);
}  // namespace divlab
