#include "kernels/profile.h"

#include <chrono>

#include "kernels/common/lowp.h"

namespace divlab {

namespace {
// The wrapper for one op: Member names the KernelSet slot, Fn its function type. Bound to its
// profiler (Kernel::state), it times the profiled kernel between two synchronisations of the
// call's stream.
template <class T, class A, Op op, auto Member, class Fn>
struct Timed;
template <class T, class A, Op op, auto Member, class... Args>
struct Timed<T, A, op, Member, void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& ctx, Args... args) {
    auto& p = *static_cast<OpProfiler<T, A>*>(ctx.state);
    const MemoryOps& mem = *p.inner().memory;
    mem.synchronize(ctx.stream);
    const auto t0 = std::chrono::steady_clock::now();
    struct Record {  // records on every exit path
      OpProfiler<T, A>& p;
      const MemoryOps& mem;
      void* stream;
      std::chrono::steady_clock::time_point t0;
      ~Record() {
        mem.synchronize(stream);
        p.add(op_name(op),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    } record{p, mem, ctx.stream, t0};
    (p.inner().*Member)(ctx, args...);
  }
};
}  // namespace

template <class T, class A>
OpProfiler<T, A>::OpProfiler(const KernelSet<T, A>& inner) : inner_(inner), timed_(inner) {
  using S = OpSignatures<T, A>;
// Op names are pasted into member names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_TIME_OP(name, Signature) \
  timed_.name = {&Timed<T, A, Op::name, &KernelSet<T, A>::name, typename S::Signature>::call, this};
  DIVLAB_OPS(DIVLAB_TIME_OP)
#undef DIVLAB_TIME_OP
  // NOLINTEND(bugprone-macro-parentheses)
}

template class OpProfiler<float>;
template class OpProfiler<double>;
template class OpProfiler<float, bf16>;
}  // namespace divlab
