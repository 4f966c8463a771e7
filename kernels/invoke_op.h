// How any op is called on any kernel set from an op's arrays: the one switch over the op list that
// turns an op's shape and scalars into its kernel's arguments (check, the GPU op tests and the
// tiled calls of kernels/tiled_arrays.h bind the arrays their own way and call through it).
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/harness.h"
#include "kernels/op_cases.h"
#include "kernels/op_spec.h"
#include "kernels/tiled_arrays.h"

namespace divlab {

// The op of that name (a name from kernels/op_list.h; anything else is the caller's bug).
inline Op op_named(const std::string& name) {
  Op op{};
  if (!parse_op(name, &op)) throw std::logic_error("op_cases: no op named '" + name + "'");
  return op;
}

// An array argument that binds nothing: it records the storage type the kernel takes it in and
// the extent the op's spec gives it at the call's shape (what binding it would allocate), and
// passes null. One pass of invoke_op with no_op_kernels and these probes a call.
struct ArgProbe {
  size_t value_bytes = 0;  // sizeof the kernel's element type for this array
  int64_t count = 0;       // values
  template <class V>
  operator V*() {
    value_bytes = sizeof(V);
    return nullptr;
  }
  size_t bytes() const { return value_bytes * size_t(count); }
};
inline void take_spec(ArgProbe& p, const ArgSpec& spec) {
  p.count = spec.size();
}

template <Op op>
using OpTag = std::integral_constant<Op, op>;

// Calls `op` of `kk` in `ctx` with the bound arrays (the op's spec says what each argument is;
// the same argument list then makes the call); `written`, when given, receives the spec of every
// array it writes.
template <class KS, class Array>
void invoke_op(Op which, const KS& kk, const OpContext& ctx, std::vector<Array>& in,
               const TokenId* ids, std::vector<Array>& out, const OpShape& s, const OpScalars& c,
               std::vector<ArgSpec>* written) {
  using U = typename KS::Value;
  const int B = s.B, T = s.T, C = s.C, V = s.V, NH = s.NH, N = B * T;
  const int64_t NC = int64_t(N) * C;
  auto call = [&](auto tag, const auto& kernel, auto&&... args) {
    constexpr Op o = decltype(tag)::value;
    static_assert(OpSpec<o>::known);
    auto specs = OpSpec<o>::args(std::forward_as_tuple(args...));
    static_assert(std::tuple_size_v<decltype(specs)> == sizeof...(args));
    size_t arg = 0;
    (take_spec(args, specs[arg++]), ...);  // a tiled array learns its extent in this call
    if (written) {
      // An output the call passes as null (a loss-only cross-entropy's dlogits) is not written:
      // kept as saved state, never compared.
      const std::array<bool, sizeof...(args)> null = {
          std::is_null_pointer_v<std::decay_t<decltype(args)>>...};
      for (size_t i = 0; i < specs.size(); ++i) {
        if (!specs[i].is_written()) continue;
        if (null[i]) specs[i].role = ArgRole::Saved;
        written->push_back(specs[i]);
      }
    }
    kernel(ctx, args...);
  };
  switch (which) {
    case Op::embedding_forward:
      call(OpTag<Op::embedding_forward>{}, kk.embedding_forward, out[0], ids, in[0], in[1], B, T, C,
           V);
      break;
    case Op::rmsnorm_forward:
      call(OpTag<Op::rmsnorm_forward>{}, kk.rmsnorm_forward, out[0], out[1], in[0], in[1], N, C,
           U(c.eps));
      break;
    case Op::rmsnorm_backward:
      call(OpTag<Op::rmsnorm_backward>{}, kk.rmsnorm_backward, out[0], out[1], in[0], in[1], in[2],
           in[3], N, C);
      break;
    case Op::linear_forward:
      call(OpTag<Op::linear_forward>{}, kk.linear_forward, out[0], in[0], in[1], N, C, V);
      break;
    case Op::linear_backward:
      call(OpTag<Op::linear_backward>{}, kk.linear_backward, out[0], out[1], in[0], in[1], in[2], N,
           C, V);
      break;
    case Op::attention_forward:
      call(OpTag<Op::attention_forward>{}, kk.attention_forward, out[0], out[1], in[0], B, T, C,
           NH);
      break;
    case Op::attention_backward:
      call(OpTag<Op::attention_backward>{}, kk.attention_backward, out[0], in[0], in[1], in[2], B,
           T, C, NH);
      break;
    case Op::gelu_forward:
      call(OpTag<Op::gelu_forward>{}, kk.gelu_forward, out[0], in[0], NC);
      break;
    case Op::gelu_backward:
      call(OpTag<Op::gelu_backward>{}, kk.gelu_backward, out[0], in[0], in[1], NC);
      break;
    case Op::add:
      call(OpTag<Op::add>{}, kk.add, out[0], in[0], in[1], NC);
      break;
    case Op::cross_entropy:
      if (c.with_gradient) {
        call(OpTag<Op::cross_entropy>{}, kk.cross_entropy, out[0], out[1], in[0], ids, N, V,
             U(c.dloss_scale / N));
      } else {
        call(OpTag<Op::cross_entropy>{}, kk.cross_entropy, out[0], nullptr, in[0], ids, N, V,
             U(c.dloss_scale / N));
      }
      break;
    case Op::embed_rmsnorm_backward:
      call(OpTag<Op::embed_rmsnorm_backward>{}, kk.embed_rmsnorm_backward, out[0], out[1], out[2],
           in[0], in[1], in[2], in[3], in[4], ids, B, T, C, V);
      break;
    case Op::cast:
      call(OpTag<Op::cast>{}, kk.cast, out[0], in[0], NC);
      break;
    case Op::sum_squares:
      call(OpTag<Op::sum_squares>{}, kk.sum_squares, out[0], in[0], NC);
      break;
    case Op::sgd_step:
      call(OpTag<Op::sgd_step>{}, kk.sgd_step, out[0], out[1], in[0], NC, U(c.lr), U(c.momentum),
           c.nesterov, U(c.weight_decay), U(c.grad_scale));
      break;
    case Op::adamw_step:
      call(OpTag<Op::adamw_step>{}, kk.adamw_step, out[0], out[1], out[2], in[0], NC, U(c.adam_lr),
           U(c.beta1), U(c.beta2), U(c.adam_eps), U(c.adam_weight_decay), U(c.grad_scale), c.step);
      break;
    case Op::grad_reduce:
      call(OpTag<Op::grad_reduce>{}, kk.grad_reduce, out[0], in[0], B, int64_t(T) * C);
      break;
    case Op::rope_forward:
      call(OpTag<Op::rope_forward>{}, kk.rope_forward, out[0], in[0], B, T, NH, s.NKV(), C / NH,
           U(c.rope_base));
      break;
    case Op::rope_backward:
      call(OpTag<Op::rope_backward>{}, kk.rope_backward, out[0], in[0], B, T, NH, s.NKV(), C / NH,
           U(c.rope_base));
      break;
    case Op::gqa_forward:
      call(OpTag<Op::gqa_forward>{}, kk.gqa_forward, out[0], in[0], N, NH, s.NKV(), C / NH);
      break;
    case Op::gqa_backward:
      call(OpTag<Op::gqa_backward>{}, kk.gqa_backward, out[0], in[0], N, NH, s.NKV(), C / NH);
      break;
    case Op::swiglu_forward:
      call(OpTag<Op::swiglu_forward>{}, kk.swiglu_forward, out[0], in[0], N, C);
      break;
    case Op::swiglu_backward:
      call(OpTag<Op::swiglu_backward>{}, kk.swiglu_backward, out[0], in[0], in[1], N, C);
      break;
    case Op::softcap_forward:
      call(OpTag<Op::softcap_forward>{}, kk.softcap_forward, out[0], in[0], int64_t(N) * V,
           U(c.softcap));
      break;
    case Op::softcap_backward:
      call(OpTag<Op::softcap_backward>{}, kk.softcap_backward, out[0], in[0], in[1], int64_t(N) * V,
           U(c.softcap));
      break;
    case Op::add_rmsnorm_forward:
      call(OpTag<Op::add_rmsnorm_forward>{}, kk.add_rmsnorm_forward, out[0], out[1], out[2], in[0],
           in[1], in[2], B, T, C, U(c.eps));
      break;
    case Op::count:
      throw std::logic_error("call_op: Op::count is not an op");
  }
}

// Every kernel a no-op that takes the same arguments: one pass of invoke_op with these binds
// (uploads) every array without running anything.
template <class Fn>
struct Noop;
template <class... Args>
struct Noop<void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& /*ctx*/, Args... /*args*/) {}
};
template <class T, class A>
KernelSet<T, A> no_op_kernels(const KernelSet<T, A>& k) {
  KernelSet<T, A> n = k;
  using S = OpSignatures<T, A>;
// Op names and signatures are pasted into member names and template arguments only.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_NO_OP(name, Signature) n.name = {&Noop<typename S::Signature>::call, nullptr};
  DIVLAB_OPS(DIVLAB_NO_OP)
#undef DIVLAB_NO_OP
  // NOLINTEND(bugprone-macro-parentheses)
  return n;
}
}  // namespace divlab
