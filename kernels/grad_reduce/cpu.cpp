#include "kernels/common/parallel.h"
#include "kernels/grad_reduce/grad_reduce.h"

namespace divlab {

constexpr int64_t kReduceChunk = 1 << 14;

template <class T>
void reduce_with(T* out, const T* shards, int ranks, int64_t n, const ReducePolicy& p) {
  parallel_chunks(n, kReduceChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = reduce_value(shards, ranks, n, i, p);
  });
}

template <class T>
void grad_reduce_reference(T* out, const T* shards, int ranks, int64_t n) {
  reduce_with(out, shards, ranks, n, ReducePolicy{});
}

template <class T>
void register_grad_reduce(Catalogue<T>& cat) {
  cat.grad_reduce.what =
      "data-parallel gradient reduction: the mean of the ranks' shard gradients (train.ranks > 1)";
  cat.grad_reduce.add("reference", grad_reduce_reference<T>,
                      {"sum over ranks in rank order in the run's precision, then divided by the "
                       "rank count",
                       "", "", ""});
}

template void reduce_with(float*, const float*, int, int64_t, const ReducePolicy&);
template void reduce_with(double*, const double*, int, int64_t, const ReducePolicy&);
template void grad_reduce_reference(float*, const float*, int, int64_t);
template void grad_reduce_reference(double*, const double*, int, int64_t);
template void register_grad_reduce(Catalogue<float>&);
template void register_grad_reduce(Catalogue<double>&);
}  // namespace divlab
