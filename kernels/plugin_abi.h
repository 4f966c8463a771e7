/* divlab plug-in ABI, version 1.
 *
 * A plug-in is a shared library that exports one C function,
 *
 *     const divlab_plugin* divlab_plugin_register(void);
 *
 * returning a table of candidate kernels. divlab loads it with `--plugins path/libx.so` (train,
 * check, kernels), `--set plugins=[path/libx.so]` or `plugins = ["..."]` in a config; its
 * variants then appear in `divlab kernels` and can be selected with kernels.<op> = "name",
 * shadowed (shadow.variants) and swept in grids like the built-in ones. The table and its strings
 * must stay valid while the library is loaded.
 *
 * Tensors: fp32, row-major, contiguous. N = B * T rows (batch-major, then position). In bf16
 * mode divlab stores activations in bf16 and calls the variant with widened fp32 copies.
 *   device "cpu":  host pointers; the kernel may use any number of threads.
 *   device "cuda": device pointers; launch on the default (legacy) stream; do not synchronise
 *                 (the run's own stream is a blocking one, so the two are ordered).
 * Token ids are int32 in [0, V). Conventions as in kernels/ops.h: a backward ADDS into parameter
 * gradients and into residual-stream gradients (dresid), and OVERWRITES plain input gradients.
 * This header is C (usable from C, C++ and CUDA) and is the whole contract: a plug-in needs no
 * other divlab header and links against nothing of divlab.
 */
#ifndef DIVLAB_PLUGIN_ABI_H
#define DIVLAB_PLUGIN_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DIVLAB_PLUGIN_ABI_VERSION 1u

typedef int32_t divlab_token;

/* One function type per op (the `op` string in parentheses). */
/* (embedding_forward) x[n] = wte[tokens[n]] + wpe[n % T]; x, wte [V, C], wpe [T, C] */
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

typedef struct {
  const char* op;         /* e.g. "embed_rmsnorm_backward" (see the op names above) */
  const char* name;       /* variant name: letters, digits, '_'; must not clash with another */
  const char* device;     /* "cpu" or "cuda" */
  void (*fn)(void);       /* the op's function type above, cast to void (*)(void) */
  const char* summary;    /* one line: what it does */
  const char* wrong;      /* what is wrong with it ("" if nothing known) */
  const char* exposed_by; /* which inputs or settings make that visible ("" if unknown) */
  const char* masked_by;  /* which hide it ("" if unknown) */
} divlab_variant;

typedef struct {
  uint32_t abi_version; /* DIVLAB_PLUGIN_ABI_VERSION the plug-in was built with */
  uint32_t count;
  const divlab_variant* variants;
} divlab_plugin;

typedef const divlab_plugin* (*divlab_plugin_register_fn)(void);
#define DIVLAB_PLUGIN_REGISTER_SYMBOL "divlab_plugin_register"

/* What the plug-in defines. Declared here, inside extern "C", so that a C++ definition written
 * without extern "C" still exports the unmangled name divlab loads. */
const divlab_plugin* divlab_plugin_register(void);

#ifdef __cplusplus
}
#endif

#endif /* DIVLAB_PLUGIN_ABI_H */
