#include "kernels/profile.h"

#include <chrono>
#include <stdexcept>

namespace divlab {

namespace {
template <class T>
OpProfiler<T>* g_profiler = nullptr;

// The wrapper for one op: Member names the KernelSet slot, Fn is its function-pointer type.
template <class T, auto Member, class Fn>
struct Timed;
template <class T, auto Member, class R, class... Args>
struct Timed<T, Member, R (*)(Args...)> {
  static const char* name;
  static R call(Args... args) {
    OpProfiler<T>& p = *g_profiler<T>;
    const MemoryOps& mem = *p.inner().memory;
    mem.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    struct Record {  // records on every exit path, including a returned value
      OpProfiler<T>& p;
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
template <class T, auto Member, class R, class... Args>
const char* Timed<T, Member, R (*)(Args...)>::name = "";

#define DIVLAB_TIME_OP(op)                                             \
  do {                                                                 \
    using W = Timed<T, &KernelSet<T>::op, decltype(KernelSet<T>::op)>; \
    W::name = #op;                                                     \
    timed.op = &W::call;                                               \
  } while (0)

template <class T>
void wrap_all(KernelSet<T>& timed) {
  DIVLAB_TIME_OP(embedding_forward);
  DIVLAB_TIME_OP(rmsnorm_forward);
  DIVLAB_TIME_OP(rmsnorm_backward);
  DIVLAB_TIME_OP(linear_forward);
  DIVLAB_TIME_OP(linear_backward);
  DIVLAB_TIME_OP(attention_forward);
  DIVLAB_TIME_OP(attention_backward);
  DIVLAB_TIME_OP(gelu_forward);
  DIVLAB_TIME_OP(gelu_backward);
  DIVLAB_TIME_OP(add);
  DIVLAB_TIME_OP(cross_entropy);
  DIVLAB_TIME_OP(embed_rmsnorm_backward);
  DIVLAB_TIME_OP(sum_squares);
  DIVLAB_TIME_OP(sgd_step);
  DIVLAB_TIME_OP(adamw_step);
}
#undef DIVLAB_TIME_OP
}  // namespace

template <class T>
OpProfiler<T>::OpProfiler(const KernelSet<T>& inner) : inner_(inner), timed_(inner) {
  if (g_profiler<T>) throw std::logic_error("profile: only one profiler may be active");
  g_profiler<T> = this;
  wrap_all(timed_);
}

template <class T>
OpProfiler<T>::~OpProfiler() {
  g_profiler<T> = nullptr;
}

template class OpProfiler<float>;
template class OpProfiler<double>;
}  // namespace divlab
