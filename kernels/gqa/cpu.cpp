#include <algorithm>

#include "kernels/gqa/gqa.h"

namespace divlab {

template <class T>
void gqa_forward_reference(T* qkv, const T* x, int N, int NH, int NKV, int HD) {
  const int64_t W = (int64_t(NH) + 2 * NKV) * HD, C = int64_t(NH) * HD;
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * W;
      T* y = qkv + n * 3 * C;
      std::copy(xr, xr + C, y);
      for (int part = 1; part <= 2; ++part)
        for (int h = 0; h < NH; ++h) {
          const T* src =
              xr + C + int64_t(part - 1) * NKV * HD + int64_t(gqa_group_head(h, NH, NKV)) * HD;
          std::copy(src, src + HD, y + part * C + int64_t(h) * HD);
        }
    }
  });
}

template <class T>
void register_gqa(Catalogue<T>& cat) {
  cat.gqa_forward.what = "grouped-query attention: key/value heads repeated for their query group";
  cat.gqa_forward.add(
      "reference", gqa_forward_reference<T>,
      {"a copy per query head (query head h reads kv head h / (NH / NKV))", "", "", ""});
  cat.gqa_backward.what = "grouped-query attention backward: kv gradients summed over each group";
  cat.gqa_backward.add(
      "reference", gqa_backward_reference<T>,
      {"each kv head's gradient summed over its group in query-head order", "", "", ""});
}

template void register_gqa(Catalogue<float>&);
template void register_gqa(Catalogue<double>&);
}  // namespace divlab
