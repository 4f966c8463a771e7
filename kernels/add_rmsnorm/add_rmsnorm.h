// The fused residual add + RMSNorm of llama-style blocks: xout = a + b, then y = rmsnorm(xout) w,
// in one pass over the row (the stream is read once). The backward needs no op of its own:
// rmsnorm_backward adds into the residual gradient, which the add passes through.
#pragma once
#include "kernels/registry.h"

namespace divlab {

// Rows [0, rows) of the op; the reference does all B T of them.
template <class T>
void add_rmsnorm_rows(T* xout, T* y, T* rstd, const T* a, const T* b, const T* w, int64_t rows,
                      int C, T eps);

template <class T>
void add_rmsnorm_forward_reference(T* xout, T* y, T* rstd, const T* a, const T* b, const T* w,
                                   int B, int T_, int C, T eps);

template <class T>
void register_add_rmsnorm(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_add_rmsnorm_variants(Catalogue<T>& cat);
}  // namespace divlab
