#include "kernels/profile.h"

#include "kernels/common/lowp.h"

namespace divlab {

namespace {
// Bound on the calls whose marks wait to be read: a long profiled run holds at most this many
// pairs of events at once.
constexpr size_t kMaxPending = 4096;

// Runs `call` between two timing marks of the call's stream and hands both to the profiler.
template <class T, class A, class Call>
void timed(OpProfiler<T, A>& p, const char* name, void* stream, Call&& call) {
  const MemoryOps& mem = *p.inner().memory;
  void* first = mem.time_mark(stream);
  void* later = nullptr;
  try {
    call();
    later = mem.time_mark(stream);
  } catch (...) {
    mem.release_mark(first);
    throw;
  }
  p.add(name, first, later);
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

template <class T, class A>
OpProfiler<T, A>::~OpProfiler() {
  reset();
}

template <class T, class A>
void OpProfiler<T, A>::add(const char* op, void* first_mark, void* later_mark) {
  pending_.push_back({op, first_mark, later_mark});
  if (pending_.size() >= kMaxPending) resolve();
}

template <class T, class A>
void OpProfiler<T, A>::resolve() {
  try {
    for (const Pending& c : pending_) {
      OpTime& t = times_[c.op];
      t.seconds += inner_.memory->seconds_between(c.first, c.later), ++t.calls;
    }
  } catch (...) {
    release_pending();
    throw;
  }
  release_pending();
}

template <class T, class A>
void OpProfiler<T, A>::release_pending() {
  for (const Pending& c : pending_)
    inner_.memory->release_mark(c.first), inner_.memory->release_mark(c.later);
  pending_.clear();
}

template <class T, class A>
const std::map<std::string, OpTime>& OpProfiler<T, A>::times() {
  resolve();
  return times_;
}

template <class T, class A>
void OpProfiler<T, A>::reset() {
  release_pending();
  times_.clear();
}

template class OpProfiler<float>;
template class OpProfiler<double>;
template class OpProfiler<float, bf16>;
}  // namespace divlab
