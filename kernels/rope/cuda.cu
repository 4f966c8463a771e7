// RoPE on the GPU: each (position, pair) angle in double as on the CPU (t theta reaches
// thousands of radians), its cosine and sine computed once per call into a [T, HD/2] table, then
// one thread per rotated pair reads them (double sin/cos per pair cost 5x the memory traffic); a
// second launch copies what is not rotated (v, and the last channel of an odd head). The
// variants are the same kernels with another pairing, offset or base.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/rope/scheme.h"

namespace divlab::cuda {

namespace {
// cos_sin[t * half + i] = (cos, sin) of position t's angle for pair i.
__global__ void angle_table(float2* cos_sin, int T, int HD, double base, int offset) {
  const int half = HD / 2;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= int64_t(T) * half) return;
  const int i = int(k % half), t = int(k / half);
  const double angle = double(t + offset) * pow(base, -2.0 * i / HD);
  cos_sin[k] = make_float2(float(cos(angle)), float(sin(angle)));
}

template <class A>
__global__ void rotate_pairs(A* y, const A* x, const float2* cos_sin, int64_t N, int T, int rotated,
                             int64_t W, int HD, float sign, bool interleaved) {
  const int half = HD / 2;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * rotated * half) return;
  const int i = int(k % half), h = int(k / half % rotated);
  const int64_t n = k / half / rotated;
  const float2 cs = cos_sin[(n % T) * half + i];
  const float c = cs.x, s = sign * cs.y;
  const int64_t i0 = n * W + int64_t(h) * HD + (interleaved ? 2 * i : i);
  const int64_t i1 = n * W + int64_t(h) * HD + (interleaved ? 2 * i + 1 : i + half);
  const float a = load(x[i0]), d = load(x[i1]);
  y[i0] = store<A>(a * c - d * s);
  y[i1] = store<A>(d * c + a * s);
}

// Every channel no pair covers: the value heads, and an odd head's last channel. `from`: the
// first column the launch covers (the value heads' when HD is even, else 0).
template <class A>
__global__ void copy_unrotated(A* y, const A* x, int64_t N, int rotated, int64_t W, int HD,
                               int64_t from) {
  const int64_t span = W - from;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * span) return;
  const int64_t j = from + k % span, at = k / span * W + j;
  if (j >= int64_t(rotated) * HD || (HD % 2 == 1 && j % HD == HD - 1)) y[at] = x[at];
}

template <class A>
void rope(const OpContext& ctx, A* y, const A* x, int B, int T_, int NH, int NKV, int HD,
          float base, int sign, const RopeScheme& scheme) {
  const int64_t N = int64_t(B) * T_, W = (int64_t(NH) + 2 * NKV) * HD;
  const int rotated = NH + NKV;
  const double b = scheme.fixed_base > 0 ? scheme.fixed_base : double(base);
  const int64_t pairs = N * rotated * (HD / 2), angles = int64_t(T_) * (HD / 2);
  if (pairs > 0) {
    auto* cos_sin = scratch_as<float2>(ctx, Scratch::A, size_t(angles));
    angle_table<<<blocks_for(angles, 256), 256, 0, stream_of(ctx)>>>(cos_sin, T_, HD, b,
                                                                     scheme.position_offset);
    rotate_pairs<<<blocks_for(pairs, 256), 256, 0, stream_of(ctx)>>>(
        y, x, cos_sin, N, T_, rotated, W, HD, float(sign), scheme.interleaved);
  }
  const int64_t from = HD % 2 == 0 ? int64_t(rotated) * HD : 0;
  if (N * (W - from) > 0)
    copy_unrotated<<<blocks_for(N * (W - from), 256), 256, 0, stream_of(ctx)>>>(y, x, N, rotated, W,
                                                                                HD, from);
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
