// Logit soft-capping on the GPU: one thread per value, dy / cosh(x / cap)^2 for the backward as
// on the CPU. The omitted cap is a copy, both ways.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
template <class A>
__global__ void softcap_forward_kernel(A* y, const A* x, int64_t n, float cap, bool omitted) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = omitted ? x[i] : store<A>(cap * tanhf(load(x[i]) / cap));
}
template <class A>
__global__ void softcap_backward_kernel(A* dx, const A* dy, const A* x, int64_t n, float cap,
                                        bool omitted) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (omitted) {
    dx[i] = dy[i];
    return;
  }
  const float c = coshf(load(x[i]) / cap);
  dx[i] = store<A>(load(dy[i]) / (c * c));
}

template <class A, bool omitted>
void softcap_forward(const OpContext& ctx, A* y, const A* x, int64_t n, float cap) {
  if (n > 0)
    softcap_forward_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(y, x, n, cap, omitted);
  DIVLAB_LAUNCHED(ctx, "softcap_forward");
}
template <class A, bool omitted>
void softcap_backward(const OpContext& ctx, A* dx, const A* dy, const A* x, int64_t n, float cap) {
  if (n > 0)
    softcap_backward_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(dx, dy, x, n, cap,
                                                                            omitted);
  DIVLAB_LAUNCHED(ctx, "softcap_backward");
}
}  // namespace

template <class A>
void register_softcap(Catalogue<float, A>& cat) {
  cat.softcap_forward.what = "logit soft-capping, cap * tanh(x / cap)";
  cat.softcap_forward.add("reference", softcap_forward<A, false>, {"tanhf per value", "", "", ""});
  cat.softcap_backward.what = "logit soft-capping backward";
  cat.softcap_backward.add("reference", softcap_backward<A, false>,
                           {"dy / cosh(x / cap)^2 per value", "", "", ""});
  cat.softcap_forward.add("omitted", softcap_forward<A, true>, {"a copy", "", "", ""});
  cat.softcap_backward.add("omitted", softcap_backward<A, true>, {"a copy", "", "", ""});
  cat.softcap_forward.pair("omitted", "softcap_backward", "omitted");
}

template void register_softcap(Catalogue<float>&);
template void register_softcap(Catalogue<float, bf16>&);
}  // namespace divlab::cuda
