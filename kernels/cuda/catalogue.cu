// The CUDA catalogues, one per mode (kernels/cuda/ops.h). GPU variants share their CPU
// namesakes' documentation (what is wrong, what exposes it, what masks it); their own summary
// says how the GPU does it.
#include "kernels/bf16_activations.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/fp64_controls.h"

namespace divlab::cuda {

namespace {
template <class A>
Catalogue<float, A> build() {
  Catalogue<float, A> cat;
  cat.memory = &device_memory();
// Directory names are pasted into function names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_REGISTER_DIRECTORY(dir) register_##dir(cat);
  DIVLAB_OP_DIRECTORIES(DIVLAB_REGISTER_DIRECTORY)
#undef DIVLAB_REGISTER_DIRECTORY
  // NOLINTEND(bugprone-macro-parentheses)
  register_reference_pairs(cat);
  // Every op's benign control: the CPU's fp64 reference on copies (kernels/fp64_controls.h).
  register_fp64_controls(cat);
  const Catalogue<float>& cpu = cpu_catalogue<float>();
  cat.for_each_op([&](auto& mine, auto) {
    cpu.for_each_op([&](const auto& cpu_ops, auto) {
      if (cpu_ops.op != mine.op) return;
      for (auto& e : mine.entries)
        if (const auto* twin = cpu_ops.find(e.name)) {
          e.doc.wrong = twin->doc.wrong;
          e.doc.exposed_by = twin->doc.exposed_by;
          e.doc.masked_by = twin->doc.masked_by;
          e.doc.benign = twin->doc.benign;
          e.doc.graphable = e.doc.graphable && twin->doc.graphable;
        }
    });
  });
  return cat;
}
}  // namespace

template <class A>
void register_reference_pairs(Catalogue<float, A>& cat) {
  const auto reference = [](const auto& ops) { return ops.find("reference")->fn; };
  // gpt2's residual add and the RMSNorm of its sum: the fused reference computes both the same
  // way (one warp per row, the same sum of squares and scaling; kernels/add_rmsnorm/cuda.cu).
  cat.pairs.add_norm = {reference(cat.add), reference(cat.rmsnorm_forward),
                        reference(cat.add_rmsnorm_forward)};
  if constexpr (std::is_same_v<A, bf16>) {
    cat.pairs.norm_backward_cast = {reference(cat.rmsnorm_backward), reference(cat.cast),
                                    rmsnorm_backward_and_cast};
    // The SGD update writing the weights' bf16 copy the next forward would cast (one read of the
    // parameters fewer a step).
    cat.pairs.sgd_cast = {reference(cat.sgd_step), reference(cat.cast), sgd_step_and_cast};
  }
  // The optimizer's per-tensor gradient norms: every span's blocks in one grid, the same blocks
  // and order each span's own call has.
  cat.pairs.sum_squares_spans = {reference(cat.sum_squares), sum_squares_spans};
}
template void register_reference_pairs(Catalogue<float>&);
template void register_reference_pairs(Catalogue<float, bf16>&);

Catalogue<float>& mutable_catalogue() {
  static Catalogue<float> fp32 = build<float>();
  return fp32;
}

const Catalogue<float>& catalogue() {
  return mutable_catalogue();
}

Catalogue<float, bf16>& mutable_bf16_catalogue() {
  static Catalogue<float, bf16> cat = build<bf16>();
  return cat;
}

const Bf16Conversions& bf16_conversions() {
  static const Bf16Conversions c{&device_memory(), widen_bf16, round_to_bf16};
  return c;
}

const Fp16Conversions& fp16_conversions() {
  static const Fp16Conversions c{&device_memory(), narrow_to_fp16, widen_fp16};
  return c;
}

const Catalogue<float, bf16>& bf16_catalogue() {
  return mutable_bf16_catalogue();
}

}  // namespace divlab::cuda
