// Simulated data-parallel ranks (train.ranks): one step's gradient of the whole batch from its
// shards, one after another on the run's device, reduced by the grad_reduce op; the dose one
// kernel call sees. Used by the trainer (experiments/train.cpp) for training, evaluation and
// the NaN replay.
#pragma once

#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "datasets/dataset.h"
#include "model/transformer.h"

namespace divlab {

// The seed of rank `rank`'s op calls in step `step` (each call derives its own from it): a
// function of the run's seed, the step and the rank alone, so a resumed run, or a step replayed
// to find a NaN, repeats every kernel's random bits. Rank 0 takes the step's first draw (a
// one-rank run is the run it always was), the others the next draws of the step's stream.
inline uint64_t rank_op_seed(uint64_t run_seed, int64_t step, int rank) {
  Rng rng(run_seed, kStreamKernel, uint64_t(step));
  uint64_t seed = rng.next();
  for (int r = 0; r < rank; ++r) seed = rng.next();
  return seed;
}

// One step's gradient of the whole batch, left in the model's gradient buffer, and the batch's
// mean loss. With train.ranks = R > 1 the batch is R shards of B / R sequences, one per
// simulated data-parallel rank: each shard's forward and backward run in turn (the model holds
// B / R sequences), its gradient (the mean over its own tokens) goes to its rank's row of
// `stacked_`, and the grad_reduce op leaves their mean in the model's gradients, as an
// all-reduce with the world-size division does across R GPUs. The batch is the one-rank run's,
// so the reference reduction gives its gradients up to the order of the sums.
template <class T, class A>
class DataParallelStep {
 public:
  DataParallelStep(Transformer<T, A>& model, int ranks)
      : model_(model),
        ranks_(ranks),
        n_(model.grads().size()),
        stacked_(*model.kernels().memory, ranks > 1 ? int64_t(ranks) * n_ : 0) {}
  // Extra memory beyond the model's: the stacked gradients.
  static int64_t extra_bytes(int ranks, int64_t params) {
    return ranks > 1 ? int64_t(ranks) * params * int64_t(sizeof(T)) : 0;
  }
  // `before(r)` and `after(r)` run around rank r's forward and backward (shadow mode taps rank
  // 0's shard); `in` and `tgt` hold the whole batch.
  template <class Before, class After>
  T run(const TokenId* in, const TokenId* tgt, uint64_t run_seed, int64_t step, Before before,
        After after) {
    const int64_t shard = int64_t(model_.batch()) * model_.config().seq_len;
    double sum = 0;
    for (int r = 0; r < ranks_; ++r) {
      before(r);
      model_.reseed(rank_op_seed(run_seed, step, r));
      sum += double(model_.forward(in + r * shard, tgt + r * shard, true));
      model_.backward();
      after(r);
      if (ranks_ > 1) stacked_.copy_from(model_.grads(), r * n_, model_.stream());
    }
    if (ranks_ > 1)
      model_.kernels().grad_reduce(model_.next_op_context(), model_.grads().data(), stacked_.data(),
                                   ranks_, n_);
    return T(sum / ranks_);
  }
  T run(const TokenId* in, const TokenId* tgt, uint64_t run_seed, int64_t step) {
    return run(
        in, tgt, run_seed, step, [](int) {}, [](int) {});
  }
  // The mean validation loss of a whole batch, shard by shard (no gradients).
  double evaluate(const TokenId* in, const TokenId* tgt) {
    const int64_t shard = int64_t(model_.batch()) * model_.config().seq_len;
    double sum = 0;
    for (int r = 0; r < ranks_; ++r)
      sum += double(model_.forward(in + r * shard, tgt + r * shard, false));
    return sum / ranks_;
  }
  int ranks() const { return ranks_; }

 private:
  Transformer<T, A>& model_;
  int ranks_;
  int64_t n_;
  Buffer<T> stacked_;
};

// The step's token statistics (every token counted into `counts`). The dose, the most additions
// one embedding row receives, is per kernel call: with data-parallel ranks, the largest of the
// shards' (each rank's embedding backward sees its own shard only).
inline BatchStats dose_of(const TokenId* tokens, int B, int T_, int ranks, int vocab,
                          std::vector<int64_t>* counts) {
  BatchStats whole = batch_stats(tokens, int64_t(B) * T_, vocab, counts);
  if (ranks > 1)
    whole.max_row_contributions = largest_shard_contributions(tokens, B, T_, ranks, vocab);
  return whole;
}

}  // namespace divlab
