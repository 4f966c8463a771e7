// How divlab calls a plug-in's kernel (kernels/plugin_abi.h), and the static_asserts that tie
// the ABI's function types to the internal op signatures (kernels/ops.h), one for one: a
// signature changed on one side only fails to build instead of corrupting memory at run time.
#pragma once

#include <type_traits>

#include "kernels/common/lowp.h"
#include "kernels/float_control.h"
#include "kernels/ops.h"
#include "kernels/plugin_abi.h"

namespace divlab {

// An internal argument as ABI 2 spells it: the same bits under the header's type names.
template <class V>
struct AbiArg {
  using type = V;
  static V of(V v) { return v; }
};
template <class L, class H>
struct AbiPointer {
  using type = H;
  static H of(L p) { return reinterpret_cast<H>(p); }
};
template <>
struct AbiArg<bf16*> : AbiPointer<bf16*, divlab_bf16*> {};
template <>
struct AbiArg<const bf16*> : AbiPointer<const bf16*, const divlab_bf16*> {};
template <>
struct AbiArg<fp16*> : AbiPointer<fp16*, divlab_fp16*> {};
template <>
struct AbiArg<const fp16*> : AbiPointer<const fp16*, const divlab_fp16*> {};
static_assert(sizeof(bf16) == sizeof(divlab_bf16) && sizeof(fp16) == sizeof(divlab_fp16));

// After a plug-in kernel that runs on the GPU: an error its launch or queued work left (an
// invalid launch configuration, past 1024 threads a block, say) is the kernel's, reported here
// (std::runtime_error) instead of left pending for whoever asks next, which would blame one of
// divlab's kernels or nobody, and a run would go on with outputs never written. With debug sync
// (debug.sync_kernels) the call's stream is waited for first. A no-op without CUDA.
void check_device_plugin_call(const OpContext& ctx);

// Calls a plug-in kernel as the ABI asks: the thread's floating-point control kept, and on the
// GPU (kDevice) its errors taken as its own.
template <bool kDevice, class F>
void call_plugin(const OpContext& ctx, F&& call) {
  call_keeping_float_control(call);
  if constexpr (kDevice) check_device_plugin_call(ctx);
}

// An op's ABI 1 function type: the internal one without its context (embedding_forward also
// without V, which ABI 2 added), and the shim that calls such an embedding_forward.
template <Op op, class Fn>
struct Abi1 {
  using Function = WithoutContext<Fn>;
};
template <class Fn>
struct Abi1<Op::embedding_forward, Fn> {
  using Function = void (*)(float*, const TokenId*, const float*, const float*, int, int, int);
  template <bool kDevice>
  static void call(const OpContext& ctx, float* x, const TokenId* tokens, const float* wte,
                   const float* wpe, int B, int T, int C, int /*V*/) {
    call_plugin<kDevice>(
        ctx, [&] { reinterpret_cast<Function>(ctx.state)(x, tokens, wte, wpe, B, T, C); });
  }
};
// The shim that calls any other op's ABI 1 kernel (bound as the Kernel's state).
template <class Fn>
struct Abi1Call;
template <class... Args>
struct Abi1Call<void (*)(const OpContext&, Args...)> {
  template <bool kDevice>
  static void call(const OpContext& ctx, Args... args) {
    // Function pointers round-trip through void* on every platform divlab builds on (POSIX).
    call_plugin<kDevice>(ctx, [&] { reinterpret_cast<void (*)(Args...)>(ctx.state)(args...); });
  }
};

// Scratch for an ABI 2 kernel: regions 0-7 of the caller's workspace, above every slot divlab's
// own kernels use. Null when it cannot be had (the ABI is C: nothing may throw through it).
constexpr int kPluginWorkspaceSlot = 64, kPluginWorkspaceRegions = 8;
void* plugin_workspace(const divlab_op_context* ctx, int region, size_t bytes);

// An internal signature's ABI 2 counterpart, and the shim that calls an ABI 2 kernel (bound as
// the Kernel's state) through it.
template <class Fn>
struct Abi2;
template <class... Args>
struct Abi2<void (*)(const OpContext&, Args...)> {
  using Function = void (*)(const divlab_op_context*, typename AbiArg<Args>::type...);
  template <bool kDevice>
  static void call(const OpContext& ctx, Args... args) {
    divlab_op_context c{};
    c.size = sizeof c;
    c.stream = ctx.stream;
    c.seed = ctx.seed;
    c.workspace = &plugin_workspace;
    c.divlab_private = ctx.plugin_workspace ? ctx.plugin_workspace : ctx.workspace;
    // Function pointers round-trip through void* on every platform divlab builds on (POSIX).
    call_plugin<kDevice>(
        ctx, [&] { reinterpret_cast<Function>(ctx.state)(&c, AbiArg<Args>::of(args)...); });
  }
};

// A plug-in function bound to its shim (Abi1<...>, Abi1Call<Fn> or Abi2<Fn>), the shim's GPU
// form for a kernel that runs on the device.
template <class Shim, class Fn>
Kernel<Fn> plugin_kernel(bool on_device, void (*fn)(void)) {
  // Function pointers round-trip through void* on every platform divlab builds on (POSIX).
  return Kernel<Fn>(on_device ? &Shim::template call<true> : &Shim::template call<false>,
                    reinterpret_cast<void*>(fn));
}

// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_TIE_ABI(name, Signature)                                                         \
  static_assert(                                                                                \
      std::is_same_v<divlab_##name, Abi1<Op::name, OpSignatures<float>::Signature>::Function>); \
  static_assert(                                                                                \
      std::is_same_v<divlab2_##name##_fp32, Abi2<OpSignatures<float>::Signature>::Function>);   \
  static_assert(std::is_same_v<divlab2_##name##_bf16,                                           \
                               Abi2<OpSignatures<float, bf16>::Signature>::Function>);          \
  static_assert(std::is_same_v<divlab2_##name##_fp16,                                           \
                               Abi2<OpSignatures<float, fp16>::Signature>::Function>);
DIVLAB_PLUGGABLE_OPS(DIVLAB_TIE_ABI)
#undef DIVLAB_TIE_ABI
// NOLINTEND(bugprone-macro-parentheses)
static_assert(std::is_same_v<divlab_token, TokenId>);

}  // namespace divlab
