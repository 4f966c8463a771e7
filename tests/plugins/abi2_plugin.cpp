// An ABI 2 test library (CPU), one kernel per dtype, written only against kernels/plugin_abi.h:
//   swiglu_forward abi2_bf16_swiglu       bf16, correct: fp32 math, one rounding per output
//   swiglu_forward abi2_bf16_swiglu_vec8  bf16, rows in packs of 8 values; a row's tail past the
//                                         last full pack is never written (wrong unless 8 | F)
//   gelu_forward   abi2_fp16_gelu         fp16, correct for fp16 storage
//   add            abi2_context_add       fp32, correct; keeps the context it was called with
//                                         (abi2_last_context) and writes through a workspace
//   grad_reduce    abi2_int8_reduce       fp32 arrays, a compressed all-reduce: each rank's
//                                         gradient in int8 with one scale per 256 values
//   rmsnorm_forward abi2_scratch_as_zero  fp32, sums each row's squares into workspace it never
//                                         clears, as if new scratch were zeros
//   add            abi2_scratch_one_short fp32, right values through scratch one value shorter
//                                         than it writes (a fencepost in the size it asks for)
//   sgd_step       abi2_sgd               correct: PyTorch's SGD, one value at a time
//   sgd_step       abi2_sgd_momentum_09   SGD that takes momentum as 0.9 whenever it is on (a
//                                         value written in where an argument was passed)
//   linear_backward abi2_dw_drops_last_row  fp32, exact but for the weight gradient, which
//                                         leaves out the last row once there are over 4096
//   adamw_step     abi2_adamw_bf16_moments  AdamW whose moments m and v are kept in bf16 (16-bit
//                                         optimizer states), the update itself in fp32
//   cross_entropy  abi2_bf16_xent_toward_zero  bf16, right math in fp64, the gradient's bf16
//                                         values rounded toward zero (a shrink of 2^-9 on average)
//   add            abi2_add_rounding_toward_zero  fp32, sets the thread's rounding toward zero for
//                                         its loop and returns without setting it back
//   rope_forward   abi2_rope_table_in_scratch  fp32, exact, its cos/sin table built when the
//                                         sequence length, head width or base changes and kept
//                                         in scratch for the next call (which may find it gone)
//   gelu_forward   abi2_erf_gelu_control  fp32, the exact (erf) GELU declared a benign control:
//                                         another function than the tanh form the op computes
// Half and bf16 conversions are written out here: the library includes nothing of divlab but the
// ABI header and must build with compilers that lack _Float16.
#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/plugin_abi.h"

namespace {

float bits_to_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
uint32_t float_to_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bf16(divlab_bf16 v) {
  return bits_to_float(uint32_t(v.bits) << 16);
}
divlab_bf16 to_bf16(float x) {  // nearest even (finite inputs)
  uint32_t u = float_to_bits(x);
  u += 0x7fffu + ((u >> 16) & 1u);
  return divlab_bf16{uint16_t(u >> 16)};
}
float from_fp16(divlab_fp16 v) {
  const int e = (v.bits >> 10) & 0x1f, m = v.bits & 0x3ff;
  const float mag = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(1024 + m), e - 25);
  return (v.bits & 0x8000) ? -mag : mag;
}
divlab_fp16 to_fp16(float x) {  // nearest even; finite inputs below 65504
  const float a = std::fabs(x);
  int e = 0;
  std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  const float quantum = std::ldexp(1.0f, e < -13 ? -24 : e - 11);
  const float r = std::nearbyint(a / quantum) * quantum;  // the current rounding mode: even
  uint16_t bits = 0;
  if (r >= 0x1p-14f) {
    std::frexp(r, &e);
    bits = uint16_t(((e + 14) << 10) | (int(std::ldexp(r, 11 - e)) & 0x3ff));
  } else {
    bits = uint16_t(r * 0x1p24f);
  }
  return divlab_fp16{uint16_t(bits | (x < 0 ? 0x8000 : 0))};
}

float silu(float g) {
  return g / (1.0f + std::exp(-g));
}

template <int kPack>
void bf16_swiglu(const divlab_op_context*, divlab_bf16* y, const divlab_bf16* x, int N, int F) {
  const int covered = kPack == 1 ? F : F / kPack * kPack;
  for (int n = 0; n < N; ++n) {
    const divlab_bf16* gate = x + size_t(n) * 2 * F;
    for (int f = 0; f < covered; ++f)
      y[size_t(n) * F + f] = to_bf16(silu(from_bf16(gate[f])) * from_bf16(gate[F + f]));
  }
}

void fp16_gelu(const divlab_op_context*, divlab_fp16* y, const divlab_fp16* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = from_fp16(x[i]);
    y[i] = to_fp16(0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))));
  }
}

divlab_op_context last_context;

void context_add(const divlab_op_context* ctx, float* y, const float* a, const float* b,
                 int64_t n) {
  last_context = *ctx;
  // Sums through scratch memory, so a workspace that is not there, or too small, shows.
  float* sum = static_cast<float*>(ctx->workspace(ctx, 7, sizeof(float) * size_t(n)));
  if (!sum) return;  // the test sees y unwritten
  for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
  std::memcpy(y, sum, sizeof(float) * size_t(n));
}

// The sum staged in scratch sized for n - 1 values: its last value lands past the region. Training
// rounds regions up to 256 bytes and keeps the largest size asked, so this writes into the heap
// only where 4 (n - 1) is a multiple of 256 and no other kernel grew the region: rarely.
void scratch_one_short(const divlab_op_context* ctx, float* y, const float* a, const float* b,
                       int64_t n) {
  float* sum = static_cast<float*>(ctx->workspace(ctx, 0, sizeof(float) * size_t(n - 1)));
  if (!sum) return;
  for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
  std::memcpy(y, sum, sizeof(float) * size_t(n));
}

// Each rank's gradient quantised to int8 with one absmax scale per block of 256 values (as a
// compressed all-reduce sends it), dequantised and summed in fp32, divided by the rank count.
void int8_reduce(const divlab_op_context*, float* out, const float* shards, int ranks, int64_t n) {
  constexpr int64_t kBlock = 256;
  for (int64_t i = 0; i < n; ++i) out[i] = 0.0f;
  for (int r = 0; r < ranks; ++r) {
    const float* g = shards + int64_t(r) * n;
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = b + kBlock < n ? b + kBlock : n;
      float absmax = 0.0f;
      for (int64_t i = b; i < e; ++i) absmax = std::fmax(absmax, std::fabs(g[i]));
      const float scale = absmax > 0.0f ? absmax / 127.0f : 1.0f;
      for (int64_t i = b; i < e; ++i) out[i] += std::nearbyint(g[i] / scale) * scale;
    }
  }
  for (int64_t i = 0; i < n; ++i) out[i] /= float(ranks);
}

// The row sums of squares accumulated in workspace region 0, never cleared first.
void scratch_as_zero(const divlab_op_context* ctx, float* y, float* rstd, const float* x,
                     const float* w, int N, int C, float eps) {
  auto* sums = static_cast<float*>(ctx->workspace(ctx, 0, sizeof(float) * size_t(N)));
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) sums[n] += x[int64_t(n) * C + c] * x[int64_t(n) * C + c];
  for (int n = 0; n < N; ++n) {
    rstd[n] = 1.0f / std::sqrt(sums[n] / float(C) + eps);
    for (int c = 0; c < C; ++c) y[int64_t(n) * C + c] = x[int64_t(n) * C + c] * rstd[n] * w[c];
  }
}

void sgd(const divlab_op_context*, float* p, float* buf, const float* g, int64_t n, float lr,
         float momentum, bool nesterov, float weight_decay, float grad_scale) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] * grad_scale + weight_decay * p[i];
    if (momentum != 0.0f) {
      buf[i] = momentum * buf[i] + d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

// momentum != 0 read as 0.9: right wherever it was tested with 0.9 only.
void sgd_momentum_09(const divlab_op_context* ctx, float* p, float* buf, const float* g, int64_t n,
                     float lr, float momentum, bool nesterov, float weight_decay,
                     float grad_scale) {
  sgd(ctx, p, buf, g, n, lr, momentum != 0.0f ? 0.9f : 0.0f, nesterov, weight_decay, grad_scale);
}

// dx = dy W; dW += dy^T x over the rows but the last, once N passes 4096 (a tiled loop's bound
// off by one at sizes past the tested ones). Sums in double: exact to fp32 otherwise.
void dw_drops_last_row(const divlab_op_context*, float* dx, float* dW, const float* dy,
                       const float* x, const float* W, int N, int in, int out) {
  // Each sum in fp64 in ascending order, rounded once; the loops walk the arrays in memory order
  // (a sum per element in strides took this test's check 80 s at its large shapes).
  std::vector<double> acc(static_cast<size_t>(in));
  for (int64_t r = 0; r < N; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) acc[i] += double(dy[r * out + o]) * W[int64_t(o) * in + i];
    for (int i = 0; i < in; ++i) dx[r * in + i] = float(acc[i]);
  }
  const int64_t rows = N > 4096 ? N - 1 : N;
  std::vector<double> dw(size_t(out) * size_t(in), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i)
        dw[size_t(o) * in + i] += double(dy[r * out + o]) * x[r * in + i];
  for (size_t k = 0; k < dw.size(); ++k) dW[k] += float(dw[k]);
}

void adamw_bf16_moments(const divlab_op_context*, float* p, float* m, float* v, const float* g,
                        int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float grad_scale, int64_t step) {
  const float c1 = 1.0f - std::pow(beta1, float(step)), c2 = 1.0f - std::pow(beta2, float(step));
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    p[i] *= 1.0f - lr * weight_decay;
    m[i] = from_bf16(to_bf16(beta1 * m[i] + (1.0f - beta1) * gi));
    v[i] = from_bf16(to_bf16(beta2 * v[i] + (1.0f - beta2) * gi * gi));
    p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
  }
}

void xent_toward_zero(const divlab_op_context*, float* losses, divlab_bf16* dlogits,
                      const divlab_bf16* logits, const divlab_token* targets, int N, int V,
                      float dloss) {
  for (int n = 0; n < N; ++n) {
    const divlab_bf16* z = logits + int64_t(n) * V;
    double m = from_bf16(z[0]), sum = 0;
    for (int v = 1; v < V; ++v) m = std::fmax(m, double(from_bf16(z[v])));
    for (int v = 0; v < V; ++v) sum += std::exp(double(from_bf16(z[v])) - m);
    const double lse = m + std::log(sum);
    losses[n] = float(lse - from_bf16(z[targets[n]]));
    if (!dlogits) continue;
    for (int v = 0; v < V; ++v) {
      const double g = std::exp(double(from_bf16(z[v])) - lse) - (v == targets[n] ? 1.0 : 0.0);
      dlogits[int64_t(n) * V + v] = divlab_bf16{uint16_t(float_to_bits(float(g * dloss)) >> 16)};
    }
  }
}

// Right to within its rounding, and every op after it in the process rounds toward zero too.
void add_rounding_toward_zero(const divlab_op_context*, float* y, const float* a, const float* b,
                              int64_t n) {
  std::fesetround(FE_TOWARDZERO);
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// The table of a call's (T, HD, base), kept in scratch region 0 between calls: right for as long
// as the region keeps what this kernel last wrote there, which the ABI does not promise.
struct TableKey {
  int T = -1, HD = -1;
  float base = -1;
} table_key;
void rope_table_in_scratch(const divlab_op_context* ctx, float* y, const float* x, int B, int T,
                           int NH, int NKV, int HD, float base) {
  const int half = HD / 2;
  auto* table = static_cast<double*>(
      ctx->workspace(ctx, 0, sizeof(double) * 2 * size_t(T) * size_t(std::max(half, 1))));
  if (!table) return;
  if (T != table_key.T || HD != table_key.HD || base != table_key.base) {
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < half; ++i) {
        const double angle = t * std::pow(double(base), -2.0 * i / HD);
        table[2 * (size_t(t) * half + i)] = std::cos(angle);
        table[2 * (size_t(t) * half + i) + 1] = std::sin(angle);
      }
    table_key = {T, HD, base};
  }
  const int64_t W = (int64_t(NH) + 2 * NKV) * HD, rotated = int64_t(NH) + NKV;
  for (int64_t n = 0; n < int64_t(B) * T; ++n) {
    const double* row = table + 2 * size_t(n % T) * half;
    std::memcpy(y + n * W, x + n * W, sizeof(float) * size_t(W));
    for (int64_t h = 0; h < rotated; ++h)
      for (int i = 0; i < half; ++i) {
        const float c = float(row[2 * i]), s = float(row[2 * i + 1]);
        const float a = x[n * W + h * HD + i], d = x[n * W + h * HD + i + half];
        y[n * W + h * HD + i] = a * c - d * s;
        y[n * W + h * HD + i + half] = d * c + a * s;
      }
  }
}

// x Phi(x), where the op is the tanh approximation (up to ~1e-3 apart near |x| = 2).
void erf_gelu(const divlab_op_context*, float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] / std::sqrt(2.0f)));
}

const divlab_variant2 kVariants[] = {
    {"swiglu_forward", "abi2_bf16_swiglu", "cpu", DIVLAB_BF16, DIVLAB_CONTROL,
     reinterpret_cast<void (*)(void)>(&bf16_swiglu<1>), "bf16 SwiGLU, fp32 math", "", "", ""},
    {"swiglu_forward", "abi2_bf16_swiglu_vec8", "cpu", DIVLAB_BF16, 0,
     reinterpret_cast<void (*)(void)>(&bf16_swiglu<8>), "bf16 SwiGLU in packs of 8",
     "a row's last F % 8 outputs are never written", "a hidden size 8 does not divide",
     "hidden sizes that are multiples of 8"},
    {"gelu_forward", "abi2_fp16_gelu", "cpu", DIVLAB_FP16, 0,
     reinterpret_cast<void (*)(void)>(&fp16_gelu), "GELU on fp16 activations", "", "", ""},
    {"add", "abi2_context_add", "cpu", DIVLAB_FP32, DIVLAB_CONTROL,
     reinterpret_cast<void (*)(void)>(&context_add), "an add through scratch memory", "", "", ""},
    {"grad_reduce", "abi2_int8_reduce", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&int8_reduce), "int8 all-reduce, a scale per 256 values",
     "a value far below its block's largest rounds to a few levels or to zero",
     "blocks mixing large and small gradients", "blocks of similar values"},
    {"rmsnorm_forward", "abi2_scratch_as_zero", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&scratch_as_zero), "row sums of squares in workspace",
     "the workspace is never cleared: each call adds to what the last one left", "", ""},
    {"add", "abi2_scratch_one_short", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&scratch_one_short), "an add staged in scratch",
     "asks for one value less scratch than it writes", "", ""},
    {"sgd_step", "abi2_sgd", "cpu", DIVLAB_FP32, 0, reinterpret_cast<void (*)(void)>(&sgd),
     "SGD with momentum, one value at a time", "", "", ""},
    {"sgd_step", "abi2_sgd_momentum_09", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&sgd_momentum_09), "SGD with momentum 0.9",
     "any other momentum is taken as 0.9", "a momentum other than 0.9", "momentum 0.9"},
    {"linear_backward", "abi2_dw_drops_last_row", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&dw_drops_last_row), "linear backward, sums in double",
     "past 4096 rows the weight gradient leaves out the last one", "more than 4096 rows",
     "up to 4096 rows"},
    {"adamw_step", "abi2_adamw_bf16_moments", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&adamw_bf16_moments), "AdamW with bf16 moments",
     "m and v rounded to bf16 at every step: a moment's small updates round away",
     "gradients far below the moments' running scale", "a few steps at bf16's grade"},
    {"cross_entropy", "abi2_bf16_xent_toward_zero", "cpu", DIVLAB_BF16, 0,
     reinterpret_cast<void (*)(void)>(&xent_toward_zero), "bf16 cross-entropy, gradient truncated",
     "every gradient value rounded toward zero: the whole gradient shrinks by about 2^-9",
     "any logits", "per-element tolerances of 1e-2; a bias summed with the losses"},
    {"rope_forward", "abi2_rope_table_in_scratch", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&rope_table_in_scratch), "RoPE from a table kept in scratch",
     "the table is read from scratch a later call may find new or another kernel's",
     "a call that finds its scratch region new", "calls that keep one region to themselves"},
    {"add", "abi2_add_rounding_toward_zero", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&add_rounding_toward_zero), "an add rounding toward zero",
     "leaves the thread rounding toward zero", "every op called after it", ""},
    {"gelu_forward", "abi2_erf_gelu_control", "cpu", DIVLAB_FP32, DIVLAB_CONTROL,
     reinterpret_cast<void (*)(void)>(&erf_gelu), "the exact GELU, x Phi(x)", "", "", ""},
};
const divlab_plugin2 kPlugin = {DIVLAB_PLUGIN_ABI2_VERSION,
                                sizeof(kVariants) / sizeof(kVariants[0]), kVariants};

}  // namespace

const divlab_plugin2* divlab_plugin_register2(void) {
  return &kPlugin;
}

// For the test: the context abi2_context_add was last called with.
extern "C" const divlab_op_context* abi2_last_context(void) {
  return &last_context;
}
