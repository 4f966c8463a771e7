// Grouped-query attention's key/value sharing (Ainslie et al. 2023): NH query heads share NKV
// key/value heads, query head h reading key/value head h / (NH / NKV) (Hugging Face's
// repeat_kv). The forward expands the projection's q | k | v row (NH + 2 NKV heads) into the
// attention ops' q | k | v layout of 3 NH heads; the backward sums each key/value head's gradient
// over the query heads of its group. NKV = NH is multi-head attention, NKV = 1 multi-query.
#pragma once
#include <cstdint>

#include "kernels/common/parallel.h"
#include "kernels/registry.h"

namespace divlab {

// The key/value head query head h reads, as the reference groups them.
inline int gqa_group_head(int h, int NH, int NKV) {
  return h / (NH / NKV);
}

template <class T>
void gqa_forward_reference(T* qkv, const T* x, int N, int NH, int NKV, int HD);
// dx from dqkv with each query head h's key/value gradient added into head kv_of(h).
template <class T, class KvOf>
void gqa_backward_with(T* dx, const T* dqkv, int N, int NH, int NKV, int HD, KvOf kv_of) {
  const int64_t W = (int64_t(NH) + 2 * NKV) * HD, C = int64_t(NH) * HD;
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* g = dqkv + n * 3 * C;
      T* d = dx + n * W;
      std::copy(g, g + C, d);  // the query heads map one to one
      std::fill(d + C, d + W, T(0));
      // In query-head order, so every sum has one fixed order.
      for (int part = 1; part <= 2; ++part)
        for (int h = 0; h < NH; ++h) {
          T* kv = d + C + int64_t(part - 1) * NKV * HD + int64_t(kv_of(h)) * HD;
          const T* gh = g + part * C + int64_t(h) * HD;
          for (int i = 0; i < HD; ++i) kv[i] += gh[i];
        }
    }
  });
}
template <class T>
void gqa_backward_reference(T* dx, const T* dqkv, int N, int NH, int NKV, int HD) {
  gqa_backward_with(dx, dqkv, N, NH, NKV, HD, [&](int h) { return gqa_group_head(h, NH, NKV); });
}

template <class T>
void register_gqa(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_gqa_variants(Catalogue<T>& cat);
}  // namespace divlab
