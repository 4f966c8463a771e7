// RoPE on the GPU: one thread per rotated pair, the angle in double as on the CPU (t theta
// reaches thousands of radians); a second launch copies what is not rotated (v, and the last
// channel of an odd head). The variants are the same kernel with another pairing, offset or base.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/rope/scheme.h"

namespace divlab::cuda {

namespace {
template <class A>
__global__ void rotate_pairs(A* y, const A* x, int64_t N, int T, int rotated, int64_t W, int HD,
                             double base, float sign, bool interleaved, int offset) {
  const int half = HD / 2;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * rotated * half) return;
  const int i = int(k % half), h = int(k / half % rotated);
  const int64_t n = k / half / rotated;
  const double angle = double(n % T + offset) * pow(base, -2.0 * i / HD);
  const float c = float(cos(angle)), s = sign * float(sin(angle));
  const int64_t i0 = n * W + int64_t(h) * HD + (interleaved ? 2 * i : i);
  const int64_t i1 = n * W + int64_t(h) * HD + (interleaved ? 2 * i + 1 : i + half);
  const float a = load(x[i0]), d = load(x[i1]);
  y[i0] = store<A>(a * c - d * s);
  y[i1] = store<A>(d * c + a * s);
}

// Every channel no pair covers: the value heads, and an odd head's last channel.
template <class A>
__global__ void copy_unrotated(A* y, const A* x, int64_t N, int rotated, int64_t W, int HD) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * W) return;
  const int64_t j = k % W;
  if (j >= int64_t(rotated) * HD || (HD % 2 == 1 && j % HD == HD - 1)) y[k] = x[k];
}

template <class A>
void rope(const OpContext& ctx, A* y, const A* x, int B, int T_, int NH, int NKV, int HD,
          float base, int sign, const RopeScheme& scheme) {
  const int64_t N = int64_t(B) * T_, W = (int64_t(NH) + 2 * NKV) * HD;
  const int rotated = NH + NKV;
  const double b = scheme.fixed_base > 0 ? scheme.fixed_base : double(base);
  const int64_t pairs = N * rotated * (HD / 2);
  if (pairs > 0)
    rotate_pairs<<<blocks_for(pairs, 256), 256, 0, stream_of(ctx)>>>(
        y, x, N, T_, rotated, W, HD, b, float(sign), scheme.interleaved, scheme.position_offset);
  if (N * W > 0)
    copy_unrotated<<<blocks_for(N * W, 256), 256, 0, stream_of(ctx)>>>(y, x, N, rotated, W, HD);
  DIVLAB_LAUNCHED(ctx, "rope");
}

template <class A, const RopeScheme* scheme, int sign>
void rope_with(const OpContext& ctx, A* y, const A* x, int B, int T_, int NH, int NKV, int HD,
               float base) {
  rope(ctx, y, x, B, T_, NH, NKV, HD, base, sign, *scheme);
}

template <class A, const RopeScheme* scheme>
void add_variant(Catalogue<float, A>& cat, const char* name) {
  cat.rope_forward.add(name, rope_with<A, scheme, +1>, {"one thread per pair", "", "", ""});
  cat.rope_backward.add(name, rope_with<A, scheme, -1>, {"one thread per pair", "", "", ""});
  if (scheme != &kRopeReference) cat.rope_forward.pair(name, "rope_backward", name);
}
}  // namespace

template <class A>
void register_rope(Catalogue<float, A>& cat) {
  cat.rope_forward.what = "rotary position embedding of q and k (half-split pairs), v copied";
  cat.rope_backward.what = "RoPE backward: the inverse rotation";
  add_variant<A, &kRopeReference>(cat, "reference");
  add_variant<A, &kRopeBase10000>(cat, "base_10000");
  add_variant<A, &kRopeInterleaved>(cat, "interleaved_pairs");
  add_variant<A, &kRopePositionPlusOne>(cat, "position_plus_one");
}

template void register_rope(Catalogue<float>&);
template void register_rope(Catalogue<float, bf16>&);
}  // namespace divlab::cuda
