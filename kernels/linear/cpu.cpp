#include <algorithm>
#include <memory>

#include "kernels/common/parallel.h"
#include "kernels/linear/linear.h"

namespace divlab {

// Each GEMM is cut into fixed row blocks, and each block is one single-threaded Eigen product.
// Eigen's own threading is never used: its k-blocking depends on the thread count, which would
// change the summation order and break bitwise determinism across thread counts.

namespace {
// dW += dy^T x, parallel over blocks of kRowChunk output rows. A narrow layer (fewer than
// kThreadsBusy blocks: a head over 64 ids, a 32-wide projection) would leave all but a thread or
// two idle on its long sums over N (16 384 rows at reproduce's size), so its sum over N is also
// cut into slices of at least kSliceRows rows, each slice's product computed alone and the
// slices' results added in slice order. Every cut follows the shapes alone, never the thread
// count, so the bits are the same on any number of threads; the slices' partial results take at
// most kSliceValues values (16 MiB in fp32).
constexpr int64_t kThreadsBusy = 4, kSliceRows = 1024, kMaxSlices = 16, kSliceValues = 1 << 22;

template <class T>
void weight_gradient(T* dW, const T* dy, const T* x, int64_t N, int64_t in, int64_t out) {
  const int64_t blocks = (out + kRowChunk - 1) / kRowChunk, size = out * in;
  const int64_t slices =
      blocks >= kThreadsBusy
          ? 1
          : std::min({kMaxSlices, N / kSliceRows, kSliceValues / std::max<int64_t>(size, 1)});
  if (slices <= 1) {  // dW rows [o0, o1) = dy[:, o0:o1]^T x in one product over all N rows
    const auto xm = matrix(x, N, in, in);
    parallel_chunks(out, kRowChunk, [&](int64_t o0, int64_t o1) {
      matrix(dW + o0 * in, o1 - o0, in, in).noalias() +=
          matrix(dy + o0, N, o1 - o0, out).transpose() * xm;
    });
    return;
  }
  const int64_t rows = (N + slices - 1) / slices;
  const std::unique_ptr<T[]> partial(new T[size_t(slices * size)]);
  parallel_chunks(slices * blocks, 1, [&](int64_t t, int64_t) {
    const int64_t n0 = t / blocks * rows, n1 = std::min(N, n0 + rows);
    const int64_t o0 = t % blocks * kRowChunk, o1 = std::min(out, o0 + kRowChunk);
    matrix(partial.get() + t / blocks * size + o0 * in, o1 - o0, in, in).noalias() =
        matrix(dy + n0 * out + o0, n1 - n0, o1 - o0, out).transpose() *
        matrix(x + n0 * in, n1 - n0, in, in);
  });
  parallel_chunks(size, 4096, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      T sum = partial[size_t(e)];
      for (int64_t s = 1; s < slices; ++s) sum += partial[size_t(s * size + e)];
      dW[e] += sum;
    }
  });
}
}  // namespace

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
  weight_gradient(dW, dy, x, N, in, out);
}

template <class T>
void register_linear(Catalogue<T>& cat) {
  cat.linear_forward.what = "y = x W^T (GEMM)";
  cat.linear_forward.add(
      "reference", linear_forward_reference<T>,
      {"Eigen GEMM per fixed row block, working-precision accumulation", "", "", ""});
  cat.linear_backward.what = "dx = dy W, dW += dy^T x (two GEMMs)";
  cat.linear_backward.add("reference", linear_backward_reference<T>,
                          {"Eigen GEMMs per fixed row block; a narrow layer's weight gradient "
                           "also in fixed slices of rows, added in order",
                           "", "", ""});
}

template void linear_forward_reference(float*, const float*, const float*, int, int, int);
template void linear_forward_reference(double*, const double*, const double*, int, int, int);
template void register_linear(Catalogue<float>&);
template void register_linear(Catalogue<double>&);
}  // namespace divlab
