#include "kernels/common/parallel.h"
#include "kernels/embedding/embedding.h"

namespace divlab {

template <class T>
void embedding_forward_reference(T* x, const TokenId* tokens, const T* wte, const T* wpe, int B,
                                 int T_, int C, int /*V: the table's rows*/) {
  parallel_chunks(int64_t(B) * T_, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* e = wte + int64_t(tokens[n]) * C;
      const T* p = wpe + (n % T_) * C;
      for (int c = 0; c < C; ++c) x[n * C + c] = e[c] + p[c];
    }
  });
}

template <class T>
void register_embedding(Catalogue<T>& cat) {
  cat.embedding_forward.what = "token + position embedding lookup";
  cat.embedding_forward.add("reference", embedding_forward_reference<T>,
                            {"row gather, exact (two adds per element)", "", "", ""});
}

template void register_embedding(Catalogue<float>&);
template void register_embedding(Catalogue<double>&);
}  // namespace divlab
