// The data-parallel gradient reduction (train.ranks > 1). Each of R ranks holds the gradient of
// its shard of the step's batch (the mean over the shard's tokens); the op leaves their mean, as
// an all-reduce with a world-size division does. The variants are the ways real data-parallel
// stacks reduce gradients and get it wrong: bf16 reductions (mixed-precision FSDP, bf16
// gradient buckets), fp16 communication without scaling, a missing world-size division, a ring
// that drops its last partial round (docs/kernels.md).
//
// Every variant on both devices computes each output value with reduce_value below, so the CPU
// and GPU variants agree bit for bit.
#pragma once
#include <cstdint>

#include "kernels/common/lowp.h"
#include "kernels/registry.h"
#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

namespace divlab {

// What each rank's value is rounded to before it travels.
enum class Wire { Exact, Bf16, Fp16 };

// How one reduction goes; the reference is the default.
struct ReducePolicy {
  Wire wire = Wire::Exact;
  bool bf16_sum = false;    // the running sum rounded to bf16 after every add
  bool reversed = false;    // ranks summed R-1 .. 0 instead of 0 .. R-1
  bool divide = true;       // the world-size division (false: the sum)
  bool drops_tail = false;  // the values past ring_covered keep rank 0's own share
};

// A pipelined ring all-reduce moves each rank's share of the buffer in slices of this many
// values, ranks x slice per round; ring_drops_tail drops the last, partial round.
constexpr int64_t kRingSlice = 4096;
DIVLAB_HOST_DEVICE constexpr int64_t ring_covered(int ranks, int64_t n) {
  return n / (ranks * kRingSlice) * (ranks * kRingSlice);
}

DIVLAB_HOST_DEVICE inline float on_wire(float x, Wire w) {
  if (w == Wire::Bf16) return lowp::bf16_rne(x);
  if (w == Wire::Fp16) {
#ifdef __CUDA_ARCH__
    return __half2float(__float2half_rn(x));
#else
    return lowp::fp16_rne(x);
#endif
  }
  return x;
}

// Output value i of a reduction of `ranks` stacked [ranks, n] gradients under policy p. T is the
// run's precision; the wire and the bf16 sum round through float (an fp64 run's exact reference
// takes neither).
template <class T>
DIVLAB_HOST_DEVICE T reduce_value(const T* shards, int ranks, int64_t n, int64_t i,
                                  const ReducePolicy& p) {
  if (p.drops_tail && i >= ring_covered(ranks, n)) return shards[i] / T(ranks);
  const auto wire = [&](int r) {
    const T x = shards[int64_t(r) * n + i];
    return p.wire == Wire::Exact ? x : T(on_wire(float(x), p.wire));
  };
  T sum = wire(p.reversed ? ranks - 1 : 0);
  for (int k = 1; k < ranks; ++k) {
    sum += wire(p.reversed ? ranks - 1 - k : k);
    if (p.bf16_sum) sum = T(lowp::bf16_rne(float(sum)));
  }
  if (!p.divide) return sum;
  const T mean = sum / T(ranks);
  return p.bf16_sum ? T(lowp::bf16_rne(float(mean))) : mean;
}

// The CPU's reduction under policy p, over fixed chunks of values (any thread count: the same
// bits).
template <class T>
void reduce_with(T* out, const T* shards, int ranks, int64_t n, const ReducePolicy& p);
template <class T>
void grad_reduce_reference(T* out, const T* shards, int ranks, int64_t n);
template <class T>
void register_grad_reduce(Catalogue<T>& cat);
// The variants and the benign control (variants.cpp), each documented where it is registered;
// their policies are shared with the GPU's (grad_reduce_variants()).
template <class T>
void register_grad_reduce_variants(Catalogue<T>& cat);

struct GradReduceVariant {
  const char* name;
  ReducePolicy policy;
  VariantDoc doc;
};
// Every variant: name, policy, documentation (the GPU registers the same list).
const std::vector<GradReduceVariant>& grad_reduce_variants();

}  // namespace divlab
