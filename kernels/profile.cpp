#include "kernels/profile.h"

#include <chrono>

#include "kernels/common/lowp.h"

namespace divlab {

namespace {
// Runs `call` between two synchronisations of the call's stream and adds its time to `op`.
template <class T, class A, class Call>
void timed(OpProfiler<T, A>& p, const char* name, void* stream, Call&& call) {
  const MemoryOps& mem = *p.inner().memory;
  mem.synchronize(stream);
  const auto t0 = std::chrono::steady_clock::now();
  struct Record {  // records on every exit path
    OpProfiler<T, A>& p;
    const char* name;
    const MemoryOps& mem;
    void* stream;
    std::chrono::steady_clock::time_point t0;
    ~Record() {
      mem.synchronize(stream);
      p.add(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  } record{p, name, mem, stream, t0};
  call();
}

// The wrapper for one op: Member names the KernelSet slot, Fn its function type. Bound to its
// profiler (Kernel::state), it times the profiled kernel.
template <class T, class A, Op op, auto Member, class Fn>
struct Timed;
template <class T, class A, Op op, auto Member, class... Args>
struct Timed<T, A, op, Member, void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& ctx, Args... args) {
    auto& p = *static_cast<OpProfiler<T, A>*>(ctx.state);
    timed(p, op_name(op), ctx.stream, [&] { (p.inner().*Member)(ctx, args...); });
  }
};

// The same for one of a reference pair's paths (kernels/reference_pairs.h), timed as Path::name.
template <class T, class A>
struct TimedPath {
  template <class Path, class Fn>
  struct Wrap;
  template <class Path, class... Args>
  struct Wrap<Path, void (*)(const OpContext&, Args...)> {
    static void call(const OpContext& ctx, Args... args) {
      auto& p = *static_cast<OpProfiler<T, A>*>(ctx.state);
      timed(p, Path::name, ctx.stream, [&] { Path::of (*p.inner().pairs)(ctx, args...); });
    }
  };
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
  // The inner set's reference pairs run as they would unprofiled, their paths timed.
  wrap_pairs<TimedPath<T, A>::template Wrap>(inner_, timed_, timed_pairs_, this);
}

template class OpProfiler<float>;
template class OpProfiler<double>;
template class OpProfiler<float, bf16>;
}  // namespace divlab
