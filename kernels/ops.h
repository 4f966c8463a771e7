// The op boundary between the model and the kernels.
//
// Every op the transformer uses is one function-pointer type below. The model calls ops only
// through a KernelSet, so a backend or a candidate variant swaps in without the model knowing.
// Layout conventions (all row-major, contiguous):
//   activations  [N, C] with N = B * T rows (batch-major, then position)
//   linear W     [out, in] (PyTorch's nn.Linear layout), y = x W^T, no bias
//   qkv          [N, 3C] as q | k | v, each split into NH heads of C / NH channels
//   att          [B, NH, T, T] softmax probabilities saved for the backward
// Every op takes the caller's OpContext first (stream, per-call seed, workspace:
// kernels/op_context.h).
// Gradient conventions: a backward ADDS into parameter gradients (they are zeroed once per step)
// and into `dresid` residual-stream gradients; it OVERWRITES plain activation gradients (`dx`).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/op_context.h"
#include "kernels/op_list.h"

namespace divlab {

using TokenId = int32_t;

// Two storage types: T for parameters, their gradients, optimizer state, the residual stream and
// its gradient, RMSNorm's rstd and the losses (the run's precision); A for the activations
// between ops and their gradients (GEMM operands and outputs, attention, GELU, logits). On the
// CPU and in the GPU's fp32 mode A = T; the GPU's bf16 mode stores activations in bf16 (A =
// bf16, kernels/common/lowp.h) and keeps T = float, as mixed-precision training does.
template <class T, class A = T>
struct OpSignatures {
  // x[n] = wte[tokens[n]] + wpe[n % T]; wte [V, C] (V sizes the table for copies of the call:
  // shadow mode, the fp64 control), wpe [T, C]
  using EmbeddingForward = void (*)(const OpContext& ctx, T* x, const TokenId* tokens, const T* wte,
                                    const T* wpe, int B, int T_, int C, int V);
  // y = x / sqrt(mean(x^2) + eps) * w; rstd[n] saved for the backward.
  using RmsnormForward = void (*)(const OpContext& ctx, A* y, T* rstd, const T* x, const T* w,
                                  int N, int C, T eps);
  // dresid += d(rmsnorm)/dx^T dy; dw += sum_n dy * x * rstd
  using RmsnormBackward = void (*)(const OpContext& ctx, T* dresid, T* dw, const A* dy, const T* x,
                                   const T* w, const T* rstd, int N, int C);
  // y[N, out] = x[N, in] W[out, in]^T. W is the weight in activation storage (see Cast).
  using LinearForward = void (*)(const OpContext& ctx, A* y, const A* x, const A* W, int N, int in,
                                 int out);
  // dx = dy W (overwrite); dW += dy^T x (into the T gradient)
  using LinearBackward = void (*)(const OpContext& ctx, A* dx, T* dW, const A* dy, const A* x,
                                  const A* W, int N, int in, int out);
  // Causal multi-head attention: out[N, C] from qkv[N, 3C]; att[B, NH, T, T] saved.
  using AttentionForward = void (*)(const OpContext& ctx, A* out, A* att, const A* qkv, int B,
                                    int T_, int C, int NH);
  // dqkv = d(attention)/dqkv^T dout (overwrite)
  using AttentionBackward = void (*)(const OpContext& ctx, A* dqkv, const A* dout, const A* qkv,
                                     const A* att, int B, int T_, int C, int NH);
  // Tanh-approximated GELU, elementwise over n values.
  using GeluForward = void (*)(const OpContext& ctx, A* y, const A* x, int64_t n);
  // dx = gelu'(x) * dy (overwrite)
  using GeluBackward = void (*)(const OpContext& ctx, A* dx, const A* dy, const A* x, int64_t n);
  // y = a + b elementwise (the residual connection: a is the stream, b a block's output).
  using Add = void (*)(const OpContext& ctx, T* y, const T* a, const A* b, int64_t n);
  // Fused softmax + cross-entropy. losses[n] = -log softmax(logits[n])[targets[n]].
  // If dlogits is non-null: dlogits = (softmax - onehot) * dloss (dloss = 1/N for a mean loss).
  using CrossEntropy = void (*)(const OpContext& ctx, T* losses, A* dlogits, const A* logits,
                                const TokenId* targets, int N, int V, T dloss);
  // The fused op the candidate kernels replace: backward of the first block's RMSNorm, the
  // residual gradient, and the embedding scatter, in one kernel.
  //   dx0[n]     = dresid[n] + rmsnorm_backward(dy_norm[n])      (per row)
  //   dw_norm   += sum_n dy_norm[n] * x0[n] * rstd[n]
  //   dwte[tok] += dx0[n]  for every n with tokens[n] == tok   (the frequent-row accumulation)
  //   dwpe[t]   += sum_b dx0[b, t]
  using EmbedRmsnormBackward = void (*)(const OpContext& ctx, T* dwte, T* dwpe, T* dw_norm,
                                        const A* dy_norm, const T* dresid, const T* x0,
                                        const T* w_norm, const T* rstd, const TokenId* tokens,
                                        int B, int T_, int C, int V);
  // y = x in activation storage (bf16: rounded to nearest even; a copy where A = T): the
  // weights before a forward, the residual gradient before the GEMMs that read it.
  using Cast = void (*)(const OpContext& ctx, A* y, const T* x, int64_t n);
  // The llama family's ops (model.arch = "llama").
  // Rotary position embedding on a packed row x [B*T, (NH + 2 NKV) HD] laid out q | k | v (NH
  // query heads, NKV key/value heads, HD channels each): every q and k head's channel pairs (i,
  // i + HD/2) rotate by angle t * base^(-2i/HD), t the row's position (n % T); v is copied.
  using RopeForward = void (*)(const OpContext& ctx, A* y, const A* x, int B, int T_, int NH,
                               int NKV, int HD, T base);
  // dx = the inverse rotation of dy (overwrite); v's gradient copied.
  using RopeBackward = void (*)(const OpContext& ctx, A* dx, const A* dy, int B, int T_, int NH,
                                int NKV, int HD, T base);
  // Grouped-query attention's key/value sharing: qkv[N, 3 NH HD] (the attention ops' layout)
  // from x[N, (NH + 2 NKV) HD]; query head h reads key/value head h / (NH / NKV).
  using GqaForward = void (*)(const OpContext& ctx, A* qkv, const A* x, int N, int NH, int NKV,
                              int HD);
  // dx = d gqa / dx^T dqkv (overwrite): each key/value head's gradient summed over its group.
  using GqaBackward = void (*)(const OpContext& ctx, A* dx, const A* dqkv, int N, int NH, int NKV,
                               int HD);
  // SwiGLU: y[N, F] = silu(gate) * up, x[N, 2F] laid out gate | up per row.
  using SwigluForward = void (*)(const OpContext& ctx, A* y, const A* x, int N, int F);
  // dx[N, 2F] = (dy * up * silu'(gate) | dy * silu(gate)) (overwrite)
  using SwigluBackward = void (*)(const OpContext& ctx, A* dx, const A* dy, const A* x, int N,
                                  int F);
  // Logit soft-capping (Gemma 2): y = cap * tanh(x / cap) over n values.
  using SoftcapForward = void (*)(const OpContext& ctx, A* y, const A* x, int64_t n, T cap);
  // dx = dy * (1 - tanh(x / cap)^2) (overwrite)
  using SoftcapBackward = void (*)(const OpContext& ctx, A* dx, const A* dy, const A* x, int64_t n,
                                   T cap);
  // The fused residual add + RMSNorm: xout = a + b (the new residual stream), y = rmsnorm(xout) w,
  // rstd saved; B and T are given because fused kernels are tuned per sequence length. Its
  // backward is rmsnorm_backward's (the add passes the gradient through).
  using AddRmsnormForward = void (*)(const OpContext& ctx, T* xout, A* y, T* rstd, const T* a,
                                     const A* b, const T* w, int B, int T_, int C, T eps);
  // *out = sum of g^2 over n values, accumulated in double in a fixed order (for the global grad
  // norm). `out` lives in the backend's memory, so a step's norms come back in one download.
  using SumSquares = void (*)(const OpContext& ctx, double* out, const T* g, int64_t n);
  // SGD with momentum (PyTorch semantics: buf = mu * buf + g; nesterov uses g + mu * buf) and
  // coupled L2 weight decay (g += wd * p). g is multiplied by grad_scale first (clipping).
  using SgdStep = void (*)(const OpContext& ctx, T* p, T* momentum_buf, const T* g, int64_t n, T lr,
                           T momentum, bool nesterov, T weight_decay, T grad_scale);
  // AdamW (Loshchilov & Hutter): p *= 1 - lr * wd, then the bias-corrected Adam update.
  // `step` counts from 1.
  using AdamwStep = void (*)(const OpContext& ctx, T* p, T* m, T* v, const T* g, int64_t n, T lr,
                             T beta1, T beta2, T eps, T weight_decay, T grad_scale, int64_t step);
  // Data-parallel gradient reduction: out[i] = mean over r of shards[r * n + i], the gradients
  // of `ranks` shards of one step's batch (each the mean over its own shard's tokens), stacked
  // [ranks, n]. out is overwritten. On one device the ranks are simulated: each shard's
  // forward and backward run in turn and this op averages their gradients, as an all-reduce
  // would across GPUs.
  using GradReduce = void (*)(const OpContext& ctx, T* out, const T* shards, int ranks, int64_t n);
};

namespace ops_detail {
struct ActivationStorage {};  // an A no other type is, to see which signatures have one
}  // namespace ops_detail
// Whether `op` has an array in the activations' storage A: in the bf16 mode only such ops see
// bf16 values; the others (the embedding, whose output is the fp32 residual stream, the
// optimizer's updates, the gradient norm and the reduction) are fp32 throughout.
constexpr bool op_has_activations(Op op) {
  using Marked = OpSignatures<float, ops_detail::ActivationStorage>;
  using Plain = OpSignatures<float, float>;
  switch (op) {
// Op names and signatures are pasted into case labels and template arguments only.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_HAS_ACTIVATIONS(name, Signature) \
  case Op::name:                                \
    return !std::is_same_v<Marked::Signature, Plain::Signature>;
    DIVLAB_OPS(DIVLAB_HAS_ACTIVATIONS)
#undef DIVLAB_HAS_ACTIVATIONS
    // NOLINTEND(bugprone-macro-parentheses)
    case Op::count:
      break;
  }
  return false;
}

}  // namespace divlab
