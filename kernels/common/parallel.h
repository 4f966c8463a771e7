// Deterministic parallel loops for the CPU kernels.
//
// Work is split into chunks whose size is fixed by the caller, never by the thread count. Each
// chunk is computed by one thread in a fixed order, so any sum inside a chunk has the same order
// on 1 thread or 16: results are bitwise identical for every OMP_NUM_THREADS.
#pragma once

#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cstdint>

namespace divlab {

template <class F>
void parallel_chunks(int64_t n, int64_t chunk, F&& body) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  // One chunk: call it directly, with no OpenMP construct at all. (An `if (chunks > 1)` clause
  // instead made a small model train 70x slower with two spinning threads: libgomp's
  // serialised regions contend with the idle team.)
  if (chunks == 1) return body(int64_t(0), n);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
}

// The calling thread's OpenMP team for a scope, as `train.threads` sets it for a run (0: left as
// it is); the team before is restored at the end.
class OmpTeam {
 public:
  explicit OmpTeam(int threads) : before_(omp_get_max_threads()), set_(threads > 0) {
    if (set_) omp_set_num_threads(threads);
  }
  ~OmpTeam() {
    if (set_) omp_set_num_threads(before_);
  }
  OmpTeam(const OmpTeam&) = delete;
  OmpTeam& operator=(const OmpTeam&) = delete;

 private:
  int before_;
  bool set_;
};

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatrixMap = Eigen::Map<RowMatrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstMatrixMap = Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>>;

// A rows x cols row-major view whose consecutive rows are `stride` elements apart.
template <class T>
MatrixMap<T> matrix(T* p, int64_t rows, int64_t cols, int64_t stride) {
  return MatrixMap<T>(p, rows, cols, Eigen::OuterStride<>(stride));
}
template <class T>
ConstMatrixMap<T> matrix(const T* p, int64_t rows, int64_t cols, int64_t stride) {
  return ConstMatrixMap<T>(p, rows, cols, Eigen::OuterStride<>(stride));
}

// Rows per chunk for row-parallel kernels: big enough for GEMM efficiency, small enough to spread.
constexpr int64_t kRowChunk = 64;

}  // namespace divlab
