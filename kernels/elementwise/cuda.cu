// GELU and the residual add on the GPU, in the same cancellation-free form as the CPU
// reference (see cpu.cpp): s = sigmoid(2u) computed from e = exp(-2|u|). Activations are read and
// written as A (storage.cuh), the residual stream as float. Each launcher runs 8 values per
// thread in packs (pack.cuh) where its pointers allow, the same arithmetic per value either way.
#include <cuda_fp16.h>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
__device__ inline void gelu_gates(float x, float& s, float& one_minus_s) {
  const float k = 0.7978845608028654f, a = 0.044715f;
  const float u = k * (x + a * x * x * x);
  const float e = expf(-2.0f * fabsf(u));
  const float big = 1.0f / (1.0f + e), small = e * big;
  s = u >= 0 ? big : small;
  one_minus_s = u >= 0 ? small : big;
}

// Each elementwise op once, as a function of one value: applied per value by both launches.
struct GeluForward {
  template <class A>
  __device__ void operator()(A& y, A x) const {
    const float xi = load(x);
    float s, one_minus_s;
    gelu_gates(xi, s, one_minus_s);
    y = store<A>(xi * s);
  }
};
struct GeluBackward {
  template <class A>
  __device__ void operator()(A& dx, A dy, A x) const {
    const float k = 0.7978845608028654f, a = 0.044715f, xi = load(x);
    float s, one_minus_s;
    gelu_gates(xi, s, one_minus_s);
    dx = store<A>(load(dy) * (s + 2.0f * xi * s * one_minus_s * k * (1.0f + 3.0f * a * xi * xi)));
  }
};
struct Add {
  template <class A>
  __device__ void operator()(float& y, float a, A b) const {
    y = a + load(b);
  }
};
struct Cast {
  template <class A>
  __device__ void operator()(A& y, float x) const {
    y = store<A>(x);
  }
};

// out[i] = f(in[i]...) for i < n, one value per thread.
template <class F, class Out, class... In>
__global__ void each_value(F f, Out* out, int64_t n, const In*... in) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(out[i], in[i]...);
}
// The same over `packs` packs of kPack values, one pack per thread.
template <class F, class Out, class... P>
__device__ __forceinline__ void apply_to_pack(F f, Out* out, int64_t p, const P&... in) {
  Pack<Out> o;
#pragma unroll
  for (int k = 0; k < kPack; ++k) f(o.v[k], in.v[k]...);
  store_pack(out, p, o);
}
template <class F, class Out, class... In>
__global__ void each_pack(F f, Out* out, int64_t packs, const In*... in) {
  const int64_t p = block_from_last() * blockDim.x + threadIdx.x;
  if (p < packs) apply_to_pack(f, out, p, load_pack(in, p)...);
}

template <class F, class Out, class... In>
void launch_elementwise(const OpContext& ctx, const char* name, F f, Out* out, int64_t n,
                        const In*... in) {
  if (n <= 0) return;
  const int64_t packs = packable({out, in...}) ? n / kPack : 0, done = packs * kPack;
  if (packs > 0)
    each_pack<<<blocks_for(packs, 256), 256, 0, stream_of(ctx)>>>(f, out, packs, in...);
  if (done < n)
    each_value<<<blocks_for(n - done, 256), 256, 0, stream_of(ctx)>>>(f, out + done, n - done,
                                                                      (in + done)...);
  DIVLAB_LAUNCHED(ctx, name);
}

template <class A>
void gelu_forward(const OpContext& ctx, A* y, const A* x, int64_t n) {
  launch_elementwise(ctx, "gelu_forward", GeluForward{}, y, n, x);
}
template <class A>
void gelu_backward(const OpContext& ctx, A* dx, const A* dy, const A* x, int64_t n) {
  launch_elementwise(ctx, "gelu_backward", GeluBackward{}, dx, n, dy, x);
}
template <class A>
void add(const OpContext& ctx, float* y, const float* a, const A* b, int64_t n) {
  launch_elementwise(ctx, "add", Add{}, y, n, a, b);
}
template <class A>
void cast(const OpContext& ctx, A* y, const float* x, int64_t n) {
  launch_elementwise(ctx, "cast", Cast{}, y, n, x);
}

__global__ void widen_kernel(float* y, const bf16* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = load(x[i]);
}
// fp16 plug-in kernels' copies (kernels/fp16_activations.h): divlab::fp16 is __half's two bytes.
__global__ void narrow_fp16_kernel(__half* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}
__global__ void widen_fp16_kernel(float* y, const __half* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __half2float(x[i]);
}
}  // namespace

void narrow_to_fp16(void* stream, fp16* out, const float* in, int64_t n) {
  if (n <= 0) return;
  const OpContext ctx{stream};
  narrow_fp16_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(reinterpret_cast<__half*>(out),
                                                                     in, n);
  DIVLAB_LAUNCHED(ctx, "narrow_to_fp16");
}
void widen_fp16(void* stream, float* out, const fp16* in, int64_t n) {
  if (n <= 0) return;
  const OpContext ctx{stream};
  widen_fp16_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(
      out, reinterpret_cast<const __half*>(in), n);
  DIVLAB_LAUNCHED(ctx, "widen_fp16");
}

void widen_bf16(void* stream, float* out, const bf16* in, int64_t n) {
  if (n <= 0) return;
  const OpContext ctx{stream};
  widen_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(out, in, n);
  DIVLAB_LAUNCHED(ctx, "widen_bf16");
}
void round_to_bf16(void* stream, bf16* out, const float* in, int64_t n) {
  if (n > 0) cast(OpContext{stream}, out, in, n);
}

template <class A>
void register_elementwise(Catalogue<float, A>& cat) {
  cat.gelu_forward.what = "GELU forward (tanh approximation)";
  cat.gelu_forward.add("reference", gelu_forward<A>,
                       {"packs of 8 values per thread where aligned", "", "", ""});
  cat.gelu_backward.what = "GELU backward";
  cat.gelu_backward.add("reference", gelu_backward<A>, {"analytic derivative", "", "", ""});
  cat.add.what = "residual add";
  cat.add.add("reference", add<A>, {"elementwise", "", "", ""});
  cat.cast.what = "copy into activation storage (the weights before a forward; dresid)";
  cat.cast.add("reference", cast<A>,
               {std::is_same_v<A, bf16> ? "round to nearest even bf16, 8 values per thread"
                                        : "a copy, 8 values per thread",
                "", "", ""});
}

template void register_elementwise(Catalogue<float>&);
template void register_elementwise(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
