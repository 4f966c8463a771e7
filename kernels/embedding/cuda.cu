// Token + position embedding on the GPU: one thread per output element.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
__global__ void embedding_forward_kernel(float* x, const TokenId* tokens, const float* wte,
                                         const float* wpe, int T_, int C, int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t n = i / C;
  const int c = int(i % C);
  x[i] = wte[int64_t(tokens[n]) * C + c] + wpe[int64_t(n % T_) * C + c];
}

void embedding_forward(const OpContext& ctx, float* x, const TokenId* tokens, const float* wte,
                       const float* wpe, int B, int T_, int C, int /*V*/) {
  const int64_t total = int64_t(B) * T_ * C;
  embedding_forward_kernel<<<blocks_for(total, 256), 256, 0, stream_of(ctx)>>>(x, tokens, wte, wpe,
                                                                               T_, C, total);
  DIVLAB_LAUNCHED(ctx, "embedding_forward");
}
}  // namespace

template <class A>
void register_embedding(Catalogue<float, A>& cat) {
  cat.embedding_forward.what = "token + position embedding lookup";
  cat.embedding_forward.add("reference", embedding_forward, {"one thread per element", "", "", ""});
}

template void register_embedding(Catalogue<float>&);
template void register_embedding(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
