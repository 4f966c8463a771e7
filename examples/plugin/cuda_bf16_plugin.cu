// An example CUDA plug-in (ABI 2) written the way a kernel benchmark submission is: raw bf16
// pointers (__nv_bfloat16: in CUDA code the ABI's divlab_bf16 is that type), its own launch
// configuration, 128-bit loads, launched on the stream divlab gives. Two SwiGLU forwards,
// y[n, f] = silu(gate[n, f]) * up[n, f] with x[n] = gate | up (2F values per row):
//   example_cuda_bf16_swiglu       eight outputs per thread, through 16-byte loads and stores
//                                  when 8 divides F, a scalar loop otherwise; fp32 math, one
//                                  rounding per output: declared a benign control.
//   example_cuda_bf16_swiglu_vec8  the same without the scalar path: each row's last F % 8
//                                  outputs are never written. Exact for every hidden size the
//                                  author benchmarked (multiples of 8), wrong for any other.
// Build: part of the project's CMake with the cuda preset (target
// divlab_example_cuda_bf16_plugin), or by hand:
//   nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC -I<divlab> cuda_bf16_plugin.cu -o libswiglu.so
// Check: divlab check swiglu_forward=example_cuda_bf16_swiglu_vec8 --backend cuda
//          --precision bf16 --plugins ./libswiglu.so
#include <cuda_bf16.h>

#include "kernels/plugin_abi.h"

namespace {

__device__ float silu(float g) {
  return g / (1.0f + expf(-g));
}

template <bool kScalarTail>
__global__ void swiglu_forward_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int N, int F) {
  const int packs = kScalarTail ? (F + 7) / 8 : F / 8;  // 8 outputs per thread
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)N * packs) return;
  const int n = int(i / packs), f0 = int(i % packs) * 8;
  const __nv_bfloat16* gate = x + (long long)n * 2 * F;
  const __nv_bfloat16* up = gate + F;
  __nv_bfloat16* out = y + (long long)n * F;
  if (F % 8 == 0) {  // every row starts 16-byte aligned: one load per half, one store
    const uint4 g4 = *reinterpret_cast<const uint4*>(gate + f0);
    const uint4 u4 = *reinterpret_cast<const uint4*>(up + f0);
    const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&g4);
    const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&u4);
    uint4 o4;
    auto* o2 = reinterpret_cast<__nv_bfloat162*>(&o4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 g = __bfloat1622float2(g2[k]), u = __bfloat1622float2(u2[k]);
      o2[k] = __floats2bfloat162_rn(silu(g.x) * u.x, silu(g.y) * u.y);
    }
    *reinterpret_cast<uint4*>(out + f0) = o4;
    return;
  }
  for (int f = f0; f < f0 + 8 && f < F; ++f)
    out[f] = __float2bfloat16_rn(silu(__bfloat162float(gate[f])) * __bfloat162float(up[f]));
}

template <bool kScalarTail>
void swiglu_forward(const divlab_op_context* ctx, __nv_bfloat16* y, const __nv_bfloat16* x, int N,
                    int F) {
  const long long threads = (long long)N * (kScalarTail ? (F + 7) / 8 : F / 8);
  if (threads == 0) return;
  const int block = 256;
  swiglu_forward_kernel<kScalarTail><<<unsigned((threads + block - 1) / block), block, 0,
                                       static_cast<cudaStream_t>(ctx->stream)>>>(y, x, N, F);
}

// The ABI's function type for this op in bf16, so a signature that drifts fails to compile.
constexpr divlab2_swiglu_forward_bf16 kCorrect = &swiglu_forward<true>;
constexpr divlab2_swiglu_forward_bf16 kPacked = &swiglu_forward<false>;

const divlab_variant2 kVariants[] = {
    {"swiglu_forward", "example_cuda_bf16_swiglu", "cuda", DIVLAB_BF16, DIVLAB_CONTROL,
     reinterpret_cast<void (*)(void)>(kCorrect),
     "example CUDA plug-in: bf16 SwiGLU, 8 outputs per thread, 16-byte loads where aligned", "", "",
     ""},
    {"swiglu_forward", "example_cuda_bf16_swiglu_vec8", "cuda", DIVLAB_BF16, 0,
     reinterpret_cast<void (*)(void)>(kPacked),
     "example CUDA plug-in: bf16 SwiGLU in packs of 8 outputs, no tail",
     "each row's last F % 8 outputs are never written (they keep what the buffer held)",
     "a hidden size 8 does not divide (check's odd and random shapes; model.mlp_hidden = 44)",
     "hidden sizes that are multiples of 8 (every size the benchmark used)"},
};
const divlab_plugin2 kPlugin = {DIVLAB_PLUGIN_ABI2_VERSION,
                                sizeof(kVariants) / sizeof(kVariants[0]), kVariants};

}  // namespace

const divlab_plugin2* divlab_plugin_register2(void) {
  return &kPlugin;
}
