// The gradient reduction's variants: how data-parallel stacks reduce gradients, right and wrong.
#include "kernels/grad_reduce/grad_reduce.h"

namespace divlab {

const std::vector<GradReduceVariant>& grad_reduce_variants() {
  static const std::vector<GradReduceVariant> variants = [] {
    ReducePolicy reversed, bf16_sum, bf16_wire, fp16_wire, sum, tail;
    reversed.reversed = true;
    bf16_sum.wire = Wire::Bf16, bf16_sum.bf16_sum = true;
    bf16_wire.wire = Wire::Bf16;
    fp16_wire.wire = Wire::Fp16;
    sum.divide = false;
    tail.drops_tail = true;
    return std::vector<GradReduceVariant>{
        {"reversed_order",
         reversed,
         {"CONTROL: the same sum over ranks in reverse rank order (a ring started at its other "
          "end), then divided by the rank count",
          "", "", "nothing to mask: differs from the reference only by rounding", true}},
        {"bf16_reduce",
         bf16_sum,
         {"the reduction in bf16: each rank's gradient rounded to bf16 and the running sum "
          "rounded to bf16 after every add, the mean rounded to bf16 (a bf16 all-reduce or "
          "reduce-scatter: mixed-precision FSDP with reduce_dtype = bf16, bf16 gradient buckets)",
          "8 significant bits per partial sum: every add can lose up to 2^-9 of the sum, so a "
          "rank's small contribution beside a large partial sum is rounded away; R - 1 roundings "
          "per value",
          "many ranks; gradients whose ranks disagree in size (a rare token's row touched by one "
          "shard); SGD, whose step is the gradient itself",
          "two ranks (one rounding, like bf16 gradient storage); round to nearest even is "
          "unbiased, so steps average the noise out"}},
        {"bf16_comm",
         bf16_wire,
         {"each rank's gradient rounded to bf16 for the wire, summed in fp32 (bf16 "
          "communication with fp32 accumulation)",
          "one bf16 rounding of every rank's gradient (relative error up to 2^-9, unbiased)",
          "per-tensor gradient error (relative L2 ~1e-3); rarely the loss",
          "averaging over ranks and steps: the rounding is unbiased and small"}},
        {"fp16_comm",
         fp16_wire,
         {"each rank's gradient rounded to fp16 for the wire without loss scaling, summed in fp32 "
          "(an fp16 compression hook)",
          "fp16's range: gradients below 6.1e-5 lose precision (subnormals, a fixed quantum of "
          "6e-8) and those below 3e-8 become zero; above 65504 they become inf",
          "small gradients: mean losses over many tokens, wide or deep models, late training; "
          "an inf (then a NaN step) where one overflows",
          "loss scaling (gradients multiplied up before the cast, as fp16 AMP does); large "
          "gradients early in training"}},
        {"sum_not_mean",
         sum,
         {"the ranks' gradients summed, not averaged: the world-size division left out",
          "every gradient R times too large",
          "SGD (every step R times larger: faster at first, then unstable); more ranks",
          "AdamW (invariant to a gradient's scale: m / sqrt(v)); gradient clipping while the "
          "norm is above the clip; a learning rate tuned with the bug in place"}},
        {"ring_drops_tail",
         tail,
         {"a pipelined ring all-reduce that moves each rank's share in slices of 4096 values and "
          "drops the last, partial round: the final n mod (R x 4096) values keep rank 0's own "
          "gradient divided by R",
          "the tail of the flat gradient buffer (the last parameters in layout order: the LM "
          "head, the final norm, the end of the last block) is never reduced: those parameters "
          "follow one shard at 1/R of its gradient",
          "SGD; per-tensor gradient norms of the tail's tensors (the trace's grad_norm_by_param); "
          "tails that hold rows of frequent tokens",
          "buffers whose size is a multiple of R x 4096; AdamW (the 1/R scale); rare tokens in "
          "the tail's rows"}},
    };
  }();
  return variants;
}

namespace {
// A variant as a kernel: its policy is the kernel's bound state.
template <class T>
void reduce_by_policy(const OpContext& ctx, T* out, const T* shards, int ranks, int64_t n) {
  reduce_with(out, shards, ranks, n, *static_cast<const ReducePolicy*>(ctx.state));
}
}  // namespace

template <class T>
void register_grad_reduce_variants(Catalogue<T>& cat) {
  using Fn = typename OpSignatures<T>::GradReduce;
  for (const GradReduceVariant& v : grad_reduce_variants())
    cat.grad_reduce.add(
        v.name, Kernel<Fn>(&reduce_by_policy<T>, const_cast<ReducePolicy*>(&v.policy)), v.doc);
}

template void register_grad_reduce_variants(Catalogue<float>&);
template void register_grad_reduce_variants(Catalogue<double>&);
}  // namespace divlab
