// The gradient reduction on one GPU over simulated ranks: one thread per value, each summing the
// ranks' values with the CPU's reduce_value (kernels/grad_reduce/grad_reduce.h), so every
// variant gives the CPU's bits. No atomics: deterministic.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/grad_reduce/grad_reduce.h"

namespace divlab::cuda {

namespace {
__global__ void reduce_kernel(float* out, const float* shards, int ranks, int64_t n,
                              ReducePolicy p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = reduce_value(shards, ranks, n, i, p);
}

void launch(const OpContext& ctx, float* out, const float* shards, int ranks, int64_t n,
            const ReducePolicy& p) {
  if (n == 0) return;
  reduce_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(out, shards, ranks, n, p);
  DIVLAB_LAUNCHED(ctx, "grad_reduce");
}

void reference(const OpContext& ctx, float* out, const float* shards, int ranks, int64_t n) {
  launch(ctx, out, shards, ranks, n, ReducePolicy{});
}

// A variant: its policy is the kernel's bound state (host memory, passed to the kernel by value).
void by_policy(const OpContext& ctx, float* out, const float* shards, int ranks, int64_t n) {
  launch(ctx, out, shards, ranks, n, *static_cast<const ReducePolicy*>(ctx.state));
}
}  // namespace

template <class A>
void register_grad_reduce(Catalogue<float, A>& cat) {
  using Fn = typename OpSignatures<float, A>::GradReduce;
  cat.grad_reduce.what =
      "data-parallel gradient reduction: the mean of the ranks' shard gradients (train.ranks > 1)";
  cat.grad_reduce.add("reference", reference,
                      {"one thread per value: fp32 sum over ranks in rank order, then divided by "
                       "the rank count",
                       "", "", ""});
  for (const GradReduceVariant& v : grad_reduce_variants())
    cat.grad_reduce.add(v.name, Kernel<Fn>(&by_policy, const_cast<ReducePolicy*>(&v.policy)),
                        v.doc);
}

template void register_grad_reduce(Catalogue<float>&);
template void register_grad_reduce(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
