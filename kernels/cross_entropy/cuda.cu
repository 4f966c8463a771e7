// Fused softmax + cross-entropy on the GPU: one block per row, fixed-tree reductions.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
template <bool subtract_max>
__global__ void cross_entropy_kernel(float* losses, float* dlogits, const float* logits,
                                     const TokenId* targets, int V, float dloss) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * V;
  float m = -INFINITY;
  if (subtract_max) {
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, z[v]);
    m = block_max(m, shared);
  } else {
    m = 0.0f;
  }
  float sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(z[v] - m);
  sum = block_sum(sum, shared);
  const float lse = m + logf(sum);
  const int target = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - z[target];
  if (!dlogits) return;
  float* d = dlogits + row * V;
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    d[v] = expf(z[v] - lse) * dloss - (v == target ? dloss : 0.0f);  // as the CPU reference
}

template <bool subtract_max>
void cross_entropy(float* losses, float* dlogits, const float* logits, const TokenId* targets,
                   int N, int V, float dloss) {
  cross_entropy_kernel<subtract_max><<<N, 512>>>(losses, dlogits, logits, targets, V, dloss);
  DIVLAB_LAUNCHED("cross_entropy");
}
}  // namespace

void register_cross_entropy(Catalogue<float>& cat) {
  cat.cross_entropy.what = "softmax cross-entropy per row, fused with its gradient";
  cat.cross_entropy.add("reference", cross_entropy<true>,
                        {"one block per row, max-subtracted log-sum-exp", "", "", ""});
  cat.cross_entropy.add("no_max_subtraction", cross_entropy<false>,
                        {"log-sum-exp without subtracting the row max", "", "", ""});
}

}  // namespace divlab::cuda
