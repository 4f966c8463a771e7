// Device-side pointer arrays for gemm_heads (kernels/cuda/gemm.h).
#include "kernels/cuda/gemm.h"

namespace divlab::cuda {

namespace {
__global__ void head_pointers_kernel(const void** a, const char* A, HeadStrides sa, const void** b,
                                     const char* B, HeadStrides sb, void** c, char* C,
                                     HeadStrides sc, int nheads, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const long long bi = i / nheads, h = i % nheads;
  a[i] = A + bi * sa.batch + h * sa.head;
  b[i] = B + bi * sb.batch + h * sb.head;
  c[i] = C + bi * sc.batch + h * sc.head;
}
}  // namespace

void head_pointers(const OpContext& ctx, const void** a, const char* A, HeadStrides sa,
                   const void** b, const char* B, HeadStrides sb, void** c, char* C, HeadStrides sc,
                   int nbatch, int nheads) {
  const int count = nbatch * nheads;
  head_pointers_kernel<<<blocks_for(count, 128), 128, 0, stream_of(ctx)>>>(a, A, sa, b, B, sb, c, C,
                                                                           sc, nheads, count);
  DIVLAB_LAUNCHED(ctx, "gemm_heads pointers");
}

}  // namespace divlab::cuda
