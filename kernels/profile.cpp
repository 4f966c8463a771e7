#include "kernels/profile.h"

#include <chrono>
#include <stdexcept>

#include "kernels/common/lowp.h"

namespace divlab {

namespace {
template <class T, class A>
OpProfiler<T, A>* g_profiler = nullptr;

// The wrapper for one op: Member names the KernelSet slot, Fn is its function-pointer type.
template <class T, class A, auto Member, class Fn>
struct Timed;
template <class T, class A, auto Member, class R, class... Args>
struct Timed<T, A, Member, R (*)(Args...)> {
  static const char* name;
  static R call(Args... args) {
    OpProfiler<T, A>& p = *g_profiler<T, A>;
    const MemoryOps& mem = *p.inner().memory;
    mem.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    struct Record {  // records on every exit path, including a returned value
      OpProfiler<T, A>& p;
      const MemoryOps& mem;
      std::chrono::steady_clock::time_point t0;
      ~Record() {
        mem.synchronize();
        p.add(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    } record{p, mem, t0};
    return (p.inner().*Member)(args...);
  }
};
template <class T, class A, auto Member, class R, class... Args>
const char* Timed<T, A, Member, R (*)(Args...)>::name = "";

#define DIVLAB_TIME_OP(op)                                                      \
  do {                                                                          \
    using W = Timed<T, A, &KernelSet<T, A>::op, decltype(KernelSet<T, A>::op)>; \
    W::name = #op;                                                              \
    timed.op = &W::call;                                                        \
  } while (0)

template <class T, class A>
void wrap_all(KernelSet<T, A>& timed) {
#define DIVLAB_TIME_LISTED_OP(name, Signature) DIVLAB_TIME_OP(name);
  DIVLAB_OPS(DIVLAB_TIME_LISTED_OP)
#undef DIVLAB_TIME_LISTED_OP
}
#undef DIVLAB_TIME_OP
}  // namespace

template <class T, class A>
OpProfiler<T, A>::OpProfiler(const KernelSet<T, A>& inner) : inner_(inner), timed_(inner) {
  if (g_profiler<T, A>) throw std::logic_error("profile: only one profiler may be active");
  g_profiler<T, A> = this;
  wrap_all(timed_);
}

template <class T, class A>
OpProfiler<T, A>::~OpProfiler() {
  g_profiler<T, A> = nullptr;
}

template class OpProfiler<float>;
template class OpProfiler<double>;
template class OpProfiler<float, bf16>;
}  // namespace divlab
