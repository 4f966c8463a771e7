// RoPE: rotary position embedding of the query and key heads (Su et al.; the half-split pairing
// of GPT-NeoX and Hugging Face's llama, `rotate_half`). A head's channel i and i + HD/2 form one
// pair, rotated by t * theta_i with theta_i = base^(-2i / HD) and t the row's position in its
// sequence. The backward is the inverse rotation (a rotation's transpose).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/parallel.h"
#include "kernels/registry.h"
#include "kernels/rope/scheme.h"

namespace divlab {

// y = R(sign * angle) x on every q and k head of the packed rows (kernels/ops.h); v copied.
// sign +1: the forward rotation; -1: its inverse, the backward.
template <class T>
void rope_apply(T* y, const T* x, int B, int T_, int NH, int NKV, int HD, T base, int sign,
                const RopeScheme& scheme) {
  const int64_t N = int64_t(B) * T_, W = (int64_t(NH) + 2 * NKV) * HD, rotated = int64_t(NH) + NKV;
  const int half = HD / 2;
  const double b = scheme.fixed_base > 0 ? scheme.fixed_base : double(base);
  std::vector<double> theta(size_t(std::max(half, 0)));
  for (int i = 0; i < half; ++i) theta[size_t(i)] = std::pow(b, -2.0 * i / HD);
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const double t = double(n % T_ + scheme.position_offset);
      const T* xr = x + n * W;
      T* yr = y + n * W;
      for (int i = 0; i < half; ++i) {
        // The angle in double whatever T is: t * theta reaches thousands of radians, where an
        // fp32 product would lose the angle's low bits before cos and sin see it.
        const double angle = t * theta[size_t(i)];
        const T c = T(std::cos(angle)), s = T(sign * std::sin(angle));
        for (int64_t h = 0; h < rotated; ++h) {
          const int64_t i0 = h * HD + (scheme.interleaved ? 2 * i : i);
          const int64_t i1 = h * HD + (scheme.interleaved ? 2 * i + 1 : i + half);
          const T a = xr[i0], d = xr[i1];
          yr[i0] = a * c - d * s;
          yr[i1] = d * c + a * s;
        }
      }
      for (int64_t h = 0; h < rotated; ++h)
        if (HD % 2) yr[h * HD + HD - 1] = xr[h * HD + HD - 1];  // odd width: the last is unpaired
      std::copy(xr + rotated * HD, xr + W, yr + rotated * HD);
    }
  });
}

template <class T>
void rope_forward_reference(T* y, const T* x, int B, int T_, int NH, int NKV, int HD, T base) {
  rope_apply(y, x, B, T_, NH, NKV, HD, base, +1, RopeScheme{});
}
template <class T>
void rope_backward_reference(T* dx, const T* dy, int B, int T_, int NH, int NKV, int HD, T base) {
  rope_apply(dx, dy, B, T_, NH, NKV, HD, base, -1, RopeScheme{});
}

template <class T>
void register_rope(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_rope_variants(Catalogue<T>& cat);
}  // namespace divlab
