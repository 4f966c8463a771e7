// An example CPU plug-in (ABI 2): two candidates for the fused embedding-gradient op, written only
// against kernels/plugin_abi.h, the way a kernel author outside divlab would.
//   example_fp32_rows  correct: every token row accumulated in fp32, in position order; declared
//                      a benign control (another summation order than the reference's).
//   example_bf16_rows  the seed bug by hand: token rows accumulated in a bf16 accumulator.
// Both take their scratch (the input gradient rows, the row accumulators) from divlab's
// workspace instead of allocating at every call.
// Build: part of the project's CMake (target divlab_example_plugin), or by hand:
//   g++ -O2 -shared -fPIC -I<divlab> cpu_plugin.cpp -o libexample.so
// Use: divlab train --set plugins=[path/libdivlab_example_plugin.so]
//                         kernels.embed_rmsnorm_backward=example_bf16_rows
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/plugin_abi.h"

namespace {

// Round-to-nearest-even to bf16 (the top 16 bits of an fp32), kept in a float.
float bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// n floats of scratch from divlab (region `region` of the call's workspace), or from `fallback`
// if it has none to give.
float* scratch(const divlab_op_context* ctx, int region, size_t n, std::vector<float>& fallback) {
  if (void* p = ctx->workspace(ctx, region, sizeof(float) * n)) return static_cast<float*>(p);
  fallback.resize(n);
  return fallback.data();
}

// dx0 rows (residual gradient plus the RMSNorm backward) and the norm gain's gradient.
void input_grad(float* dx0, float* dw_norm, const float* dy, const float* dresid, const float* x,
                const float* w, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* dyr = dy + size_t(n) * C;
    const float* xr = x + size_t(n) * C;
    const float r = rstd[n];
    float dot = 0;
    for (int c = 0; c < C; ++c) dot += dyr[c] * w[c] * xr[c];
    const float k = r * r * r * dot / float(C);
    for (int c = 0; c < C; ++c) {
      dx0[size_t(n) * C + c] = dresid[size_t(n) * C + c] + r * w[c] * dyr[c] - xr[c] * k;
      dw_norm[c] += dyr[c] * xr[c] * r;
    }
  }
}

template <bool bf16_rows>
void embed_rmsnorm_backward(const divlab_op_context* ctx, float* dwte, float* dwpe, float* dw_norm,
                            const float* dy_norm, const float* dresid, const float* x0,
                            const float* w_norm, const float* rstd, const divlab_token* tokens,
                            int B, int T, int C, int V) {
  const int N = B * T;
  std::vector<float> heap0, heap1;
  float* dx0 = scratch(ctx, 0, size_t(N) * C, heap0);
  float* acc = scratch(ctx, 1, size_t(V) * C, heap1);
  input_grad(dx0, dw_norm, dy_norm, dresid, x0, w_norm, rstd, N, C);
  std::fill(acc, acc + size_t(V) * C, 0.0f);
  for (int n = 0; n < N; ++n) {
    float* row = acc + size_t(tokens[n]) * C;
    for (int c = 0; c < C; ++c) {
      row[c] += dx0[size_t(n) * C + c];
      if (bf16_rows) row[c] = bf16(row[c]);
    }
    for (int c = 0; c < C; ++c) dwpe[size_t(n % T) * C + c] += dx0[size_t(n) * C + c];
  }
  for (size_t i = 0; i < size_t(V) * C; ++i) dwte[i] += acc[i];
}

const divlab_variant2 kVariants[] = {
    {"embed_rmsnorm_backward", "example_fp32_rows", "cpu", DIVLAB_FP32, DIVLAB_CONTROL,
     reinterpret_cast<void (*)(void)>(&embed_rmsnorm_backward<false>),
     "example plug-in: token rows summed in fp32, position order", "", "", ""},
    {"embed_rmsnorm_backward", "example_bf16_rows", "cpu", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&embed_rmsnorm_backward<true>),
     "example plug-in: token rows summed in a bf16 accumulator",
     "a frequent token's row stalls once its sum is 2^8 times a contribution",
     "skewed token streams (Zipf, real text), many tokens per step", "uniform tokens; AdamW"},
};
const divlab_plugin2 kPlugin = {DIVLAB_PLUGIN_ABI2_VERSION,
                                sizeof(kVariants) / sizeof(kVariants[0]), kVariants};

}  // namespace

const divlab_plugin2* divlab_plugin_register2(void) {
  return &kPlugin;
}
