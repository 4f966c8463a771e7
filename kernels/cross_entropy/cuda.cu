// Fused softmax + cross-entropy on the GPU: one block per row, fixed-tree reductions.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
template <bool subtract_max, class A>
__global__ void cross_entropy_kernel(float* losses, A* dlogits, const A* logits,
                                     const TokenId* targets, int V, float dloss) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const A* z = logits + row * V;
  float m = -INFINITY;
  if (subtract_max) {
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, load(z[v]));
    m = block_max(m, shared);
  } else {
    m = 0.0f;
  }
  float sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(load(z[v]) - m);
  sum = block_sum(sum, shared);
  const float lse = m + logf(sum);
  const int target = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - load(z[target]);
  if (!dlogits) return;
  A* d = dlogits + row * V;
  for (int v = threadIdx.x; v < V; v += blockDim.x)  // as the CPU reference
    d[v] = store<A>(expf(load(z[v]) - lse) * dloss - (v == target ? dloss : 0.0f));
}

template <bool subtract_max, class A>
void cross_entropy(const OpContext& ctx, float* losses, A* dlogits, const A* logits,
                   const TokenId* targets, int N, int V, float dloss) {
  cross_entropy_kernel<subtract_max>
      <<<N, 512, 0, stream_of(ctx)>>>(losses, dlogits, logits, targets, V, dloss);
  DIVLAB_LAUNCHED("cross_entropy");
}
}  // namespace

template <class A>
void register_cross_entropy(Catalogue<float, A>& cat) {
  cat.cross_entropy.what = "softmax cross-entropy per row, fused with its gradient";
  cat.cross_entropy.add("reference", cross_entropy<true, A>,
                        {"one block per row, max-subtracted log-sum-exp", "", "", ""});
  cat.cross_entropy.add("no_max_subtraction", cross_entropy<false, A>,
                        {"log-sum-exp without subtracting the row max", "", "", ""});
}

template void register_cross_entropy(Catalogue<float>&);
template void register_cross_entropy(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
