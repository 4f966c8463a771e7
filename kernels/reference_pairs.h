// Reference pairs: paths a backend's own references take together when the model calls them in
// sequence, each giving the same bits as the ops called one by one (their tests compare the
// two). The model takes one only where the set's kernels for the ops it stands for are still
// exactly the ones named here: a candidate, a shadow tap, an adapter or a plug-in on either op
// makes them run op by op. Wrappers of every op (the profiler, the op tracker) wrap the paths
// too (wrap_pairs), so a profiled or tracked step runs what a bare one does.
#pragma once

#include <type_traits>

#include "kernels/op_context.h"
#include "kernels/op_list.h"
#include "kernels/ops.h"

namespace divlab {

template <class T, class A>
struct KernelSet;

template <class T, class A = T>
struct ReferencePairs {
  using S = OpSignatures<T, A>;
  // Attention: the reference forward and backward, and the same two with state passed between
  // them (a fused forward saves no probabilities, so its backward would otherwise recompute the
  // forward's output and row statistics): the statistics in `att`, where the output is in the
  // caller's workspace. The saving forward writes the same output; where the statistics do not
  // fit in `att` both fall back to the references.
  struct Attention {
    Kernel<typename S::AttentionForward> forward, saving_forward;
    Kernel<typename S::AttentionBackward> backward, saved_backward;
  } attention;
  // gpt2's residual add and the RMSNorm of the sum after it: the fused add + RMSNorm reference
  // (which llama's blocks call as an op), one read of the stream fewer.
  struct AddNorm {
    Kernel<typename S::Add> add;
    Kernel<typename S::RmsnormForward> norm;
    Kernel<typename S::AddRmsnormForward> fused;
  } add_norm;
  // The RMSNorm backward into the residual gradient and the cast of that gradient to A for the
  // GEMM that reads it next (bf16 mode): one pass writing both.
  struct NormBackwardCast {
    using Fused = void (*)(const OpContext& ctx, T* dresid, T* dw, const A* dy, const T* x,
                           const T* w, const T* rstd, int N, int C, A* dresid_copy);
    Kernel<typename S::RmsnormBackward> norm_backward;
    Kernel<typename S::Cast> cast;
    Kernel<Fused> fused;
  } norm_backward_cast;
  // The optimizer's SGD update and the cast of the parameters to A that the next forward begins
  // with (bf16 mode): the update writes the copy too, and the forward skips its cast while the
  // copy is current (nothing else changed the parameters since: Transformer::cast_weights).
  struct SgdCast {
    using Fused = void (*)(const OpContext& ctx, T* p, T* momentum_buf, const T* g, int64_t n, T lr,
                           T momentum, bool nesterov, T weight_decay, T grad_scale, A* p_copy);
    Kernel<typename S::SgdStep> sgd_step;
    Kernel<typename S::Cast> cast;
    Kernel<Fused> fused;
  } sgd_cast;
  // One op called in turn over many spans of one buffer: sum_squares over each parameter
  // tensor's gradient (the optimizer's norms), in three launches instead of two per tensor.
  // spans: offset and size of each span, in device memory and on the host.
  struct SumSquaresSpans {
    using Fused = void (*)(const OpContext& ctx, double* out, const T* base,
                           const int64_t* device_spans, const int64_t* host_spans, int count);
    Kernel<typename S::SumSquares> sum_squares;
    Kernel<Fused> fused;
  } sum_squares_spans;
};

// The paths, for wrappers: `of` reaches one in a ReferencePairs; `name` is what a profile calls
// it (the op it stands for, or both ops' names where it does the work of two); `op` is the op
// whose kernel runs (what a crash report names).
namespace pair_path {
// Struct names and members are pasted into declarations, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_PAIR_PATH(Path, reported_as, runs, member) \
  struct Path {                                           \
    static constexpr const char* name = reported_as;      \
    static constexpr Op op = Op::runs;                    \
    template <class P>                                    \
    static const auto& of(const P& p) {                   \
      return p.member;                                    \
    }                                                     \
  };
DIVLAB_PAIR_PATH(SavingForward, "attention_forward", attention_forward, attention.saving_forward)
DIVLAB_PAIR_PATH(SavedBackward, "attention_backward", attention_backward, attention.saved_backward)
DIVLAB_PAIR_PATH(AddNorm, "add+rmsnorm_forward", add_rmsnorm_forward, add_norm.fused)
DIVLAB_PAIR_PATH(NormBackwardCast, "rmsnorm_backward+cast", rmsnorm_backward,
                 norm_backward_cast.fused)
DIVLAB_PAIR_PATH(SgdCast, "sgd_step+cast", sgd_step, sgd_cast.fused)
DIVLAB_PAIR_PATH(SumSquaresSpans, "sum_squares (spans)", sum_squares, sum_squares_spans.fused)
#undef DIVLAB_PAIR_PATH
// NOLINTEND(bugprone-macro-parentheses)
}  // namespace pair_path

// For a set whose every op wraps `inner`'s (`wrapped`, each wrapper bound to `state`): fills
// `out` with the pairs `inner` runs, the wrapped kernels standing for the references and each
// path wrapped by Wrap<Path, Function>::call (bound to `state`, reaching the inner path through
// Path::of), and points `wrapped` at it; pairs `inner` does not run stay empty.
template <template <class, class> class Wrap, class T, class A>
void wrap_pairs(const KernelSet<T, A>& inner, KernelSet<T, A>& wrapped, ReferencePairs<T, A>& out,
                void* state) {
  const auto wrap = [state](auto path, const auto& kernel) {
    using K = std::decay_t<decltype(kernel)>;
    return K(&Wrap<decltype(path), typename K::Function>::call, state);
  };
  wrapped.pairs = nullptr;
  if (!inner.pairs) return;
  const ReferencePairs<T, A>& p = *inner.pairs;
  out = {};
  if (inner.attention_pair())
    out.attention = {
        wrapped.attention_forward, wrap(pair_path::SavingForward{}, p.attention.saving_forward),
        wrapped.attention_backward, wrap(pair_path::SavedBackward{}, p.attention.saved_backward)};
  if (inner.add_norm_pair())
    out.add_norm = {wrapped.add, wrapped.rmsnorm_forward,
                    wrap(pair_path::AddNorm{}, p.add_norm.fused)};
  if (inner.norm_backward_cast_pair())
    out.norm_backward_cast = {wrapped.rmsnorm_backward, wrapped.cast,
                              wrap(pair_path::NormBackwardCast{}, p.norm_backward_cast.fused)};
  if (inner.sgd_cast_pair())
    out.sgd_cast = {wrapped.sgd_step, wrapped.cast, wrap(pair_path::SgdCast{}, p.sgd_cast.fused)};
  if (inner.sum_squares_spans_path())
    out.sum_squares_spans = {wrapped.sum_squares,
                             wrap(pair_path::SumSquaresSpans{}, p.sum_squares_spans.fused)};
  wrapped.pairs = &out;
}

}  // namespace divlab
