/* divlab plug-in ABI, versions 2 (current) and 1 (still loaded).
 *
 * A plug-in is a shared library that exports one C function returning a table of candidate
 * kernels:
 *
 *     const divlab_plugin2* divlab_plugin_register2(void);     (ABI 2)
 *     const divlab_plugin*  divlab_plugin_register(void);      (ABI 1, read without the above)
 *
 * divlab loads it with `--plugins path/libx.so` or `plugins = ["..."]` (a config, a grid, or
 * `--set plugins=[...]`) in every command; its variants then appear in `divlab kernels` and can
 * be selected with kernels.<op> = "name", shadowed (shadow.variants; the model's ops), checked
 * and swept in grids like the built-in ones. The ops: the model's, the data-parallel gradient
 * reduction and the optimizer's updates (each op's function types below). The table and its
 * strings must stay valid while the library is loaded.
 *
 * Tensors: row-major, contiguous. N = B * T rows (batch-major, then position). Token ids are
 * int32 in [0, V). Conventions as in kernels/ops.h: a backward ADDS into parameter gradients and
 * into residual-stream gradients (dresid), and OVERWRITES plain input gradients. This header is
 * C (usable from C, C++ and CUDA) and is the whole contract: a plug-in needs no other divlab
 * header and links against nothing of divlab.
 *
 * ABI 2: every kernel receives the call's context first (a stream, a seed, scratch memory) and
 * declares the dtype of the activations it reads and writes, so a kernel plugs in as written:
 *   fp32  the fp32 mode's kernel (train.precision = "fp32"); in the bf16 mode divlab runs it on
 *         widened fp32 copies of its bf16 activations and rounds its activation outputs to bf16.
 *   bf16  the bf16 mode's kernel (train.precision = "bf16", check --precision bf16): its
 *         activation arguments are bf16 arrays (in CUDA code divlab_bf16 is __nv_bfloat16).
 *   fp16  IEEE half activations (in CUDA, __half). divlab has no fp16 mode: in the fp32 mode
 *         such a kernel runs on copies of its activation inputs rounded to fp16 and its
 *         activation outputs are widened back, which is what storing those activations in
 *         fp16 would do around it.
 * Whatever the dtype, parameters and their gradients, the residual stream (x, dresid, a),
 * RMSNorm's rstd, the losses and every scalar stay float: mixed precision's master copies, which
 * `divlab check` holds to fp32 accuracy in the bf16 mode too (a float output rounded to bf16, or
 * a weight gradient summed in bf16, fails it as "fp32 outputs"). In the function types below, A
 * is the declared dtype and every other array is float.
 *   device "cpu":  host pointers; the kernel may use any number of threads.
 *   device "cuda": device pointers; launch on ctx->stream and do not synchronise the device.
 * A kernel returns with the calling thread's floating-point control (rounding direction,
 * flush-to-zero, exception traps) as it found it: divlab checks after every call, restores it
 * and fails the call (check's conditions, a run) where it changed. On cuda, an error the
 * kernel's launch leaves pending is read right after the call and fails it the same way.
 * A variant that computes the op's math and differs from the reference only by rounding (another
 * summation order, wider accumulation) can declare itself a benign control (DIVLAB_CONTROL):
 * analyses then use it in the noise floor against which candidates are judged. */
#ifndef DIVLAB_PLUGIN_ABI_H
#define DIVLAB_PLUGIN_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t divlab_token;

/* ---- ABI 2 ---- */
#define DIVLAB_PLUGIN_ABI2_VERSION 2u

/* The activations' dtype a variant is written for (divlab_variant2::dtype). */
#define DIVLAB_FP32 1u
#define DIVLAB_BF16 2u
#define DIVLAB_FP16 3u
/* divlab_variant2::flags */
#define DIVLAB_CONTROL 1u /* a benign control: the op's math, different only in rounding */

/* 16-bit floats as plain data (the top half of an fp32; IEEE binary16). CUDA code gets CUDA's own
 * types, the same two bytes, so a kernel written for them needs no casts. */
#if defined(__CUDACC__)
typedef __nv_bfloat16 divlab_bf16;
typedef __half divlab_fp16;
#else
typedef struct {
  uint16_t bits;
} divlab_bf16;
typedef struct {
  uint16_t bits;
} divlab_fp16;
#endif

/* What every ABI 2 kernel receives first. */
typedef struct divlab_op_context {
  uint32_t size;     /* sizeof(divlab_op_context) in the calling divlab: fields only get appended */
  uint32_t reserved; /* 0 */
  /* cuda: the cudaStream_t to launch on; the run's work is ordered on it, so a kernel queued
   * there needs no synchronisation (NULL is the legacy default stream). cpu: NULL. */
  void* stream;
  /* This call's seed, fresh for every call: a kernel that draws random bits (stochastic
   * rounding) draws them from it. A pure function of the run's seed, the step and the call, so
   * a repeated or resumed run draws the same bits. */
  uint64_t seed;
  /* Scratch memory in the device's memory (host or device): region 0 to 7, `bytes` long (use
   * no byte past them: `divlab check` guards the end), 256-byte aligned, owned by divlab. Valid
   * until the kernel returns and, on cuda, for the work it queued on ctx->stream; asking again
   * for a region may move it (its contents are then lost). Its contents are whatever was last
   * written there, never zeros by promise: a new region holds all-ones bytes (NaN as float).
   * NULL if it cannot be had (a region out of range, memory exhausted). */
  void* (*workspace)(const struct divlab_op_context* ctx, int region, size_t bytes);
  void* divlab_private; /* divlab's; do not touch */
} divlab_op_context;

/* The ABI 2 function types: divlab2_<op>_<dtype>, with A the activation type (semantics: the
 * ABI 1 comment of the same op below; ABI 2's embedding_forward also receives V, wte's rows). */
/* A is a type name, pasted into declarations (never an expression to parenthesise). */
/* NOLINTBEGIN(bugprone-macro-parentheses) */
#define DIVLAB2_FUNCTION_TYPES(dtype, A)                                                           \
  typedef void (*divlab2_embedding_forward_##dtype)(const divlab_op_context* ctx, float* x,        \
                                                    const divlab_token* tokens, const float* wte,  \
                                                    const float* wpe, int B, int T, int C, int V); \
  typedef void (*divlab2_rmsnorm_forward_##dtype)(const divlab_op_context* ctx, A* y, float* rstd, \
                                                  const float* x, const float* w, int N, int C,    \
                                                  float eps);                                      \
  typedef void (*divlab2_rmsnorm_backward_##dtype)(                                                \
      const divlab_op_context* ctx, float* dresid, float* dw, const A* dy, const float* x,         \
      const float* w, const float* rstd, int N, int C);                                            \
  typedef void (*divlab2_linear_forward_##dtype)(const divlab_op_context* ctx, A* y, const A* x,   \
                                                 const A* W, int N, int in, int out);              \
  typedef void (*divlab2_linear_backward_##dtype)(const divlab_op_context* ctx, A* dx, float* dW,  \
                                                  const A* dy, const A* x, const A* W, int N,      \
                                                  int in, int out);                                \
  typedef void (*divlab2_attention_forward_##dtype)(const divlab_op_context* ctx, A* out, A* att,  \
                                                    const A* qkv, int B, int T, int C, int NH);    \
  typedef void (*divlab2_attention_backward_##dtype)(const divlab_op_context* ctx, A* dqkv,        \
                                                     const A* dout, const A* qkv, const A* att,    \
                                                     int B, int T, int C, int NH);                 \
  typedef void (*divlab2_gelu_forward_##dtype)(const divlab_op_context* ctx, A* y, const A* x,     \
                                               int64_t n);                                         \
  typedef void (*divlab2_gelu_backward_##dtype)(const divlab_op_context* ctx, A* dx, const A* dy,  \
                                                const A* x, int64_t n);                            \
  typedef void (*divlab2_add_##dtype)(const divlab_op_context* ctx, float* y, const float* a,      \
                                      const A* b, int64_t n);                                      \
  typedef void (*divlab2_cross_entropy_##dtype)(                                                   \
      const divlab_op_context* ctx, float* losses, A* dlogits, const A* logits,                    \
      const divlab_token* targets, int N, int V, float dloss);                                     \
  typedef void (*divlab2_embed_rmsnorm_backward_##dtype)(                                          \
      const divlab_op_context* ctx, float* dwte, float* dwpe, float* dw_norm, const A* dy_norm,    \
      const float* dresid, const float* x0, const float* w_norm, const float* rstd,                \
      const divlab_token* tokens, int B, int T, int C, int V);                                     \
  typedef void (*divlab2_rope_forward_##dtype)(const divlab_op_context* ctx, A* y, const A* x,     \
                                               int B, int T, int NH, int NKV, int HD, float base); \
  typedef void (*divlab2_rope_backward_##dtype)(const divlab_op_context* ctx, A* dx, const A* dy,  \
                                                int B, int T, int NH, int NKV, int HD,             \
                                                float base);                                       \
  typedef void (*divlab2_gqa_forward_##dtype)(const divlab_op_context* ctx, A* qkv, const A* x,    \
                                              int N, int NH, int NKV, int HD);                     \
  typedef void (*divlab2_gqa_backward_##dtype)(const divlab_op_context* ctx, A* dx, const A* dqkv, \
                                               int N, int NH, int NKV, int HD);                    \
  typedef void (*divlab2_swiglu_forward_##dtype)(const divlab_op_context* ctx, A* y, const A* x,   \
                                                 int N, int F);                                    \
  typedef void (*divlab2_swiglu_backward_##dtype)(const divlab_op_context* ctx, A* dx,             \
                                                  const A* dy, const A* x, int N, int F);          \
  typedef void (*divlab2_softcap_forward_##dtype)(const divlab_op_context* ctx, A* y, const A* x,  \
                                                  int64_t n, float cap);                           \
  typedef void (*divlab2_softcap_backward_##dtype)(const divlab_op_context* ctx, A* dx,            \
                                                   const A* dy, const A* x, int64_t n, float cap); \
  typedef void (*divlab2_add_rmsnorm_forward_##dtype)(                                             \
      const divlab_op_context* ctx, float* xout, A* y, float* rstd, const float* a, const A* b,    \
      const float* w, int B, int T, int C, float eps);                                             \
  typedef void (*divlab2_grad_reduce_##dtype)(const divlab_op_context* ctx, float* out,            \
                                              const float* shards, int ranks, int64_t n);          \
  typedef void (*divlab2_sgd_step_##dtype)(const divlab_op_context* ctx, float* p, float* buf,     \
                                           const float* g, int64_t n, float lr, float momentum,    \
                                           bool nesterov, float weight_decay, float grad_scale);   \
  typedef void (*divlab2_adamw_step_##dtype)(const divlab_op_context* ctx, float* p, float* m,     \
                                             float* v, const float* g, int64_t n, float lr,        \
                                             float beta1, float beta2, float eps,                  \
                                             float weight_decay, float grad_scale, int64_t step);
/* NOLINTEND(bugprone-macro-parentheses) */
DIVLAB2_FUNCTION_TYPES(fp32, float)
DIVLAB2_FUNCTION_TYPES(bf16, divlab_bf16)
DIVLAB2_FUNCTION_TYPES(fp16, divlab_fp16)

typedef struct {
  const char* op;         /* e.g. "swiglu_forward" (the op names in parentheses below) */
  const char* name;       /* variant name: letters, digits, '_'; must not clash with another */
  const char* device;     /* "cpu" or "cuda" */
  uint32_t dtype;         /* DIVLAB_FP32, DIVLAB_BF16 or DIVLAB_FP16 */
  uint32_t flags;         /* 0, or DIVLAB_CONTROL */
  void (*fn)(void);       /* divlab2_<op>_<dtype>, cast to void (*)(void) */
  const char* summary;    /* one line: what it does */
  const char* wrong;      /* what is wrong with it ("" if nothing known; a control must say "") */
  const char* exposed_by; /* which inputs or settings make that visible ("" if unknown) */
  const char* masked_by;  /* which hide it ("" if unknown) */
} divlab_variant2;

typedef struct {
  uint32_t abi_version; /* DIVLAB_PLUGIN_ABI2_VERSION */
  uint32_t count;
  const divlab_variant2* variants;
} divlab_plugin2;

typedef const divlab_plugin2* (*divlab_plugin_register2_fn)(void);
#define DIVLAB_PLUGIN_REGISTER2_SYMBOL "divlab_plugin_register2"

/* What an ABI 2 plug-in defines. Declared here, inside extern "C", so that a C++ definition
 * written without extern "C" still exports the unmangled name divlab loads. */
const divlab_plugin2* divlab_plugin_register2(void);

#define DIVLAB_PLUGIN_ABI_VERSION 1u /* the ABI 1 table's version */

/* ---- ABI 1 (still loaded): fp32 tensors, no context. One function type per op (the `op`
 * string in parentheses); the op semantics stated here hold for ABI 2 as well. */
/* (embedding_forward) x[n] = wte[tokens[n]] + wpe[n % T]; x [B T, C], wte [V, C], wpe [T, C]
 * (ABI 2 passes V last) */
typedef void (*divlab_embedding_forward)(float* x, const divlab_token* tokens, const float* wte,
                                         const float* wpe, int B, int T, int C);
/* (rmsnorm_forward) y = x / sqrt(mean(x^2) + eps) * w; rstd[n] saved */
typedef void (*divlab_rmsnorm_forward)(float* y, float* rstd, const float* x, const float* w, int N,
                                       int C, float eps);
/* (rmsnorm_backward) dresid += d rmsnorm / dx^T dy; dw += sum_n dy * x * rstd */
typedef void (*divlab_rmsnorm_backward)(float* dresid, float* dw, const float* dy, const float* x,
                                        const float* w, const float* rstd, int N, int C);
/* (linear_forward) y[N, out] = x[N, in] W[out, in]^T */
typedef void (*divlab_linear_forward)(float* y, const float* x, const float* W, int N, int in,
                                      int out);
/* (linear_backward) dx = dy W (overwrite); dW += dy^T x */
typedef void (*divlab_linear_backward)(float* dx, float* dW, const float* dy, const float* x,
                                       const float* W, int N, int in, int out);
/* (attention_forward) causal multi-head attention: out [N, C] from qkv [N, 3C] (q | k | v, NH
 * heads of C / NH each); att [B, NH, T, T] softmax probabilities saved for the backward */
typedef void (*divlab_attention_forward)(float* out, float* att, const float* qkv, int B, int T,
                                         int C, int NH);
/* (attention_backward) dqkv = d attention / dqkv^T dout (overwrite) */
typedef void (*divlab_attention_backward)(float* dqkv, const float* dout, const float* qkv,
                                          const float* att, int B, int T, int C, int NH);
/* (gelu_forward) tanh-approximated GELU over n values; (gelu_backward) dx = gelu'(x) dy */
typedef void (*divlab_gelu_forward)(float* y, const float* x, int64_t n);
typedef void (*divlab_gelu_backward)(float* dx, const float* dy, const float* x, int64_t n);
/* (add) y = a + b */
typedef void (*divlab_add)(float* y, const float* a, const float* b, int64_t n);
/* (cross_entropy) losses[n] = -log softmax(logits[n])[targets[n]]; if dlogits is not null,
 * dlogits = (softmax - onehot) * dloss */
typedef void (*divlab_cross_entropy)(float* losses, float* dlogits, const float* logits,
                                     const divlab_token* targets, int N, int V, float dloss);
/* (embed_rmsnorm_backward) the fused op of the reported bug:
 *   dx0[n]   = dresid[n] + rmsnorm_backward(dy_norm[n])   (x0, w_norm, rstd of the first norm)
 *   dw_norm += sum_n dy_norm[n] * x0[n] * rstd[n]
 *   dwte[tokens[n]] += dx0[n];  dwpe[n % T] += dx0[n]          dwte [V, C], dwpe [T, C] */
typedef void (*divlab_embed_rmsnorm_backward)(float* dwte, float* dwpe, float* dw_norm,
                                              const float* dy_norm, const float* dresid,
                                              const float* x0, const float* w_norm,
                                              const float* rstd, const divlab_token* tokens, int B,
                                              int T, int C, int V);
/* The llama family's ops (model.arch = "llama"). x: [N, (NH + 2 NKV) HD] laid out q | k | v */
/* (rope_forward) every q and k head's channel pairs (i, i + HD/2) rotated by (n % T) theta_i,
 * theta_i = base^(-2i / HD); v copied. (rope_backward) the inverse rotation of dy. */
typedef void (*divlab_rope_forward)(float* y, const float* x, int B, int T, int NH, int NKV, int HD,
                                    float base);
typedef void (*divlab_rope_backward)(float* dx, const float* dy, int B, int T, int NH, int NKV,
                                     int HD, float base);
/* (gqa_forward) qkv [N, 3 NH HD] from x, query head h reading key/value head h / (NH / NKV);
 * (gqa_backward) dx from dqkv (overwrite), each kv head's gradient summed over its group */
typedef void (*divlab_gqa_forward)(float* qkv, const float* x, int N, int NH, int NKV, int HD);
typedef void (*divlab_gqa_backward)(float* dx, const float* dqkv, int N, int NH, int NKV, int HD);
/* (swiglu_forward) y [N, F] = silu(gate) * up, x [N, 2F] = gate | up; (swiglu_backward) dx
 * [N, 2F] (overwrite) */
typedef void (*divlab_swiglu_forward)(float* y, const float* x, int N, int F);
typedef void (*divlab_swiglu_backward)(float* dx, const float* dy, const float* x, int N, int F);
/* (softcap_forward) y = cap tanh(x / cap); (softcap_backward) dx = dy (1 - tanh(x / cap)^2) */
typedef void (*divlab_softcap_forward)(float* y, const float* x, int64_t n, float cap);
typedef void (*divlab_softcap_backward)(float* dx, const float* dy, const float* x, int64_t n,
                                        float cap);
/* (add_rmsnorm_forward) xout = a + b; y = xout / sqrt(mean(xout^2) + eps) * w; rstd[n] saved;
 * all [B T, C] but w [C] and rstd [B T] */
typedef void (*divlab_add_rmsnorm_forward)(float* xout, float* y, float* rstd, const float* a,
                                           const float* b, const float* w, int B, int T, int C,
                                           float eps);

/* (grad_reduce) data-parallel ranks (train.ranks > 1): out[i] = mean over r of
 * shards[r n + i], the ranks' gradients of their shards of the batch stacked [ranks, n]
 * (overwrite); an all-reduce with the world-size division, as divlab's ranks simulate it. Its
 * arrays are all float: the dtype a variant declares only says which mode runs it. */
typedef void (*divlab_grad_reduce)(float* out, const float* shards, int ranks, int64_t n);

/* The optimizer's updates, one parameter tensor of n values a call, in place, every array float
 * whatever the mode (the dtype a variant declares only says which mode runs it), the parameter
 * p the fp32 master copy. Both take the gradient g times grad_scale (global-norm clipping's
 * factor, 1 without it) as the step's gradient. PyTorch's semantics, to the letter:
 * (sgd_step) d = g grad_scale + weight_decay p (coupled L2 decay); with momentum != 0,
 *   buf = momentum buf + d (buf starts at zeros) and d = nesterov ? d + momentum buf : buf;
 *   then p -= lr d.
 * (adamw_step) p *= 1 - lr weight_decay (decoupled decay); m = beta1 m + (1 - beta1) g';
 *   v = beta2 v + (1 - beta2) g'^2 with g' = g grad_scale; then
 *   p -= lr (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps), step counting from 1.
 * The trainer calls them once per parameter tensor per step, in parameter order; a kernel that
 * keeps state between calls is wrong (the state belongs in p, buf, m and v, which checkpoints
 * save and resumes restore). */
typedef void (*divlab_sgd_step)(float* p, float* buf, const float* g, int64_t n, float lr,
                                float momentum, bool nesterov, float weight_decay,
                                float grad_scale);
typedef void (*divlab_adamw_step)(float* p, float* m, float* v, const float* g, int64_t n, float lr,
                                  float beta1, float beta2, float eps, float weight_decay,
                                  float grad_scale, int64_t step);

typedef struct {
  const char* op;         /* e.g. "embed_rmsnorm_backward" (see the op names above) */
  const char* name;       /* variant name: letters, digits, '_'; must not clash with another */
  const char* device;     /* "cpu" or "cuda" (launch on the legacy default stream) */
  void (*fn)(void);       /* the op's function type above, cast to void (*)(void) */
  const char* summary;    /* one line: what it does */
  const char* wrong;      /* what is wrong with it ("" if nothing known) */
  const char* exposed_by; /* which inputs or settings make that visible ("" if unknown) */
  const char* masked_by;  /* which hide it ("" if unknown) */
} divlab_variant;

typedef struct {
  uint32_t abi_version; /* DIVLAB_PLUGIN_ABI_VERSION (1) */
  uint32_t count;
  const divlab_variant* variants;
} divlab_plugin;

typedef const divlab_plugin* (*divlab_plugin_register_fn)(void);
#define DIVLAB_PLUGIN_REGISTER_SYMBOL "divlab_plugin_register"

/* What an ABI 1 plug-in defines. Declared here, inside extern "C", so that a C++ definition written
 * without extern "C" still exports the unmangled name divlab loads. */
const divlab_plugin* divlab_plugin_register(void);

#ifdef __cplusplus
}
#endif

#endif /* DIVLAB_PLUGIN_ABI_H */
