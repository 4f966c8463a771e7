#include "kernels/common/parallel.h"
#include "kernels/linear/linear.h"

namespace divlab {

// Each GEMM is cut into fixed row blocks, and each block is one single-threaded Eigen product.
// Eigen's own threading is never used: its k-blocking depends on the thread count, which would
// change the summation order and break bitwise determinism across thread counts.

template <class T>
void linear_forward_reference(T* y, const T* x, const T* W, int N, int in, int out) {
  const auto Wm = matrix(W, out, in, in);
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    matrix(y + n0 * out, n1 - n0, out, out).noalias() =
        matrix(x + n0 * in, n1 - n0, in, in) * Wm.transpose();
  });
}

template <class T>
void linear_backward_reference(T* dx, T* dW, const T* dy, const T* x, const T* W, int N, int in,
                               int out) {
  const auto Wm = matrix(W, out, in, in);
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    matrix(dx + n0 * in, n1 - n0, in, in).noalias() = matrix(dy + n0 * out, n1 - n0, out, out) * Wm;
  });
  // dW rows [o0, o1) = dy[:, o0:o1]^T x: the sum over all N rows stays inside one product.
  const auto xm = matrix(x, N, in, in);
  parallel_chunks(out, kRowChunk, [&](int64_t o0, int64_t o1) {
    matrix(dW + o0 * in, o1 - o0, in, in).noalias() +=
        matrix(dy + o0, N, o1 - o0, out).transpose() * xm;
  });
}

template <class T>
void register_linear(Catalogue<T>& cat) {
  cat.linear_forward.what = "y = x W^T (GEMM)";
  cat.linear_forward.add(
      "reference", linear_forward_reference<T>,
      {"Eigen GEMM per fixed row block, working-precision accumulation", "", "", ""});
  cat.linear_backward.what = "dx = dy W, dW += dy^T x (two GEMMs)";
  cat.linear_backward.add("reference", linear_backward_reference<T>,
                          {"Eigen GEMMs per fixed row block", "", "", ""});
}

template void linear_forward_reference(float*, const float*, const float*, int, int, int);
template void linear_forward_reference(double*, const double*, const double*, int, int, int);
template void register_linear(Catalogue<float>&);
template void register_linear(Catalogue<double>&);
}  // namespace divlab
