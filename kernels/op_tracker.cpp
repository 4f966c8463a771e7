#include "kernels/op_tracker.h"

#include "kernels/common/lowp.h"

namespace divlab {

namespace {
// The wrapper for one op (Member: its KernelSet slot). A call that throws leaves the mark set,
// so the catcher knows the exception came out of this op.
template <class T, class A, Op op, auto Member, class Fn>
struct Tracked;
template <class T, class A, Op op, auto Member, class... Args>
struct Tracked<T, A, op, Member, void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& ctx, Args... args) {
    const auto& t = *static_cast<const OpTracker<T, A>*>(ctx.state);
    OpNote& note = t.note();
    note.op.store(int(op), std::memory_order_relaxed);
    note.inside.store(true, std::memory_order_relaxed);
    (t.inner().*Member)(ctx, args...);
    note.inside.store(false, std::memory_order_relaxed);
  }
};

// The same for one of a reference pair's paths (kernels/reference_pairs.h), marked as Path::op.
template <class T, class A>
struct TrackedPath {
  template <class Path, class Fn>
  struct Wrap;
  template <class Path, class... Args>
  struct Wrap<Path, void (*)(const OpContext&, Args...)> {
    static void call(const OpContext& ctx, Args... args) {
      const auto& t = *static_cast<const OpTracker<T, A>*>(ctx.state);
      OpNote& note = t.note();
      note.op.store(int(Path::op), std::memory_order_relaxed);
      note.inside.store(true, std::memory_order_relaxed);
      Path::of (*t.inner().pairs)(ctx, args...);
      note.inside.store(false, std::memory_order_relaxed);
    }
  };
};
}  // namespace

template <class T, class A>
OpTracker<T, A>::OpTracker(const KernelSet<T, A>& inner, OpNote& note)
    : inner_(inner), tracked_(inner), note_(note) {
  using S = OpSignatures<T, A>;
// Op names are pasted into member names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_TRACK_OP(name, Signature)                                                          \
  tracked_.name = {&Tracked<T, A, Op::name, &KernelSet<T, A>::name, typename S::Signature>::call, \
                   this};
  DIVLAB_OPS(DIVLAB_TRACK_OP)
#undef DIVLAB_TRACK_OP
  // NOLINTEND(bugprone-macro-parentheses)
  // The inner set's reference pairs run as they would untracked, their paths tracked.
  wrap_pairs<TrackedPath<T, A>::template Wrap>(inner_, tracked_, tracked_pairs_, this);
}

template class OpTracker<float>;
template class OpTracker<double>;
template class OpTracker<float, bf16>;
}  // namespace divlab
