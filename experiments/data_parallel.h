// Data-parallel ranks (train.ranks): one step's gradient of the whole batch from its shards,
// simulated one after another on the run's device or one per GPU over NCCL, reduced by the
// grad_reduce op; the dose one kernel call sees. Used by the trainer (experiments/train.cpp) for
// training, evaluation and the NaN replay.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "common/signals.h"
#include "datasets/dataset.h"
#include "kernels/communicator.h"
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

// What one rank reports after each step (gathered from every rank over NCCL): its shard's mean
// loss, where its time went, and whether it was asked to stop. Every rank decides from the same
// gathered reports, so all stop after the same step and none is left waiting in a collective.
struct RankReport {
  double loss = 0;
  double compute_s = 0;  // its shard's forward and backward
  double reduce_s = 0;   // gathering the ranks' gradients and reducing them
  double stop = 0;       // the stop signal that reached this rank (SIGINT, ...), or 0
};

// One step's gradient of the whole batch, left in the model's gradient buffer, and the batch's
// mean loss. With train.ranks = R > 1 the batch is R shards of B / R sequences, one per
// data-parallel rank; each rank's gradient (the mean over its own tokens) goes to its row of
// `stacked_`, and the grad_reduce op leaves their mean in the model's gradients, as an
// all-reduce with the world-size division does. The batch is the one-rank run's, so the
// reference reduction gives its gradients up to the order of the sums.
//
// Simulated ranks (no communicator) run their shards one after another on this device. Ranks
// over NCCL run their own shard each and fill `stacked_` by an all-gather: the same bits in the
// same rows, reduced by the same kernel, so both give the same numbers, every variant included.
//
// With M micro-batches (train.micro_batches) each shard is M batches of the model's size, run
// one after another, each adding its gradient into the model's buffer (gradient accumulation as
// llm.c does it, in place). The two ways of splitting a batch differ for a kernel that
// accumulates in low precision: a rank's gradient starts from zero and the ranks' are averaged
// by grad_reduce (in fp32 for the reference, as PyTorch's autograd adds a fresh gradient into
// .grad), so ranks divide the dose one accumulator receives; micro-batches go on adding into the
// same rows, so they do not.
template <class T, class A>
class DataParallelStep {
 public:
  DataParallelStep(Transformer<T, A>& model, int ranks, int micro_batches = 1,
                   Communicator* comm = nullptr)
      : model_(model),
        ranks_(ranks),
        comm_(comm),
        n_(model.grads().size()),
        stacked_(*model.kernels().memory, ranks > 1 ? int64_t(ranks) * n_ : 0),
        reports_(size_t(ranks)) {
    model.set_micro_batches(micro_batches);
  }
  // Extra memory beyond the model's: the stacked gradients.
  static int64_t extra_bytes(int ranks, int64_t params) {
    return ranks > 1 ? int64_t(ranks) * params * int64_t(sizeof(T)) : 0;
  }
  // `before(r)` and `after(r)` run around rank r's forward and backward (of its first
  // micro-batch: shadow mode taps rank 0's); `in` and `tgt` hold the whole batch.
  template <class Before, class After>
  T run(const TokenId* in, const TokenId* tgt, uint64_t run_seed, int64_t step, Before before,
        After after) {
    if (comm_ == nullptr) return run_in_turn(in, tgt, run_seed, step, before, after);
    using Clock = std::chrono::steady_clock;
    const MemoryOps& mem = *model_.kernels().memory;
    const int r = comm_->world().rank;
    const auto t0 = Clock::now();
    RankReport mine;
    mine.loss = train_shard(r, in, tgt, run_seed, step, before, after);
    // Waiting for the shard's kernels here splits the step's time into compute and reduction
    // (the all-gather waits for them anyway, and the reports below for everything).
    mem.synchronize(model_.stream());
    const auto t1 = Clock::now();
    comm_->all_gather(model_.grads().data(), stacked_.data(), size_t(n_) * sizeof(T),
                      model_.stream());
    model_.kernels().grad_reduce(model_.next_op_context(), model_.grads().data(), stacked_.data(),
                                 ranks_, n_);
    mem.synchronize(model_.stream());
    mine.compute_s = std::chrono::duration<double>(t1 - t0).count();
    mine.reduce_s = std::chrono::duration<double>(Clock::now() - t1).count();
    mine.stop = stop_signal();
    comm_->all_gather_host(&mine, reports_.data(), sizeof mine, model_.stream());
    double sum = 0;  // in rank order, as the simulated ranks add them
    for (const RankReport& rep : reports_) sum += rep.loss;
    return T(sum / ranks_);
  }
  T run(const TokenId* in, const TokenId* tgt, uint64_t run_seed, int64_t step) {
    return run(
        in, tgt, run_seed, step, [](int) {}, [](int) {});
  }
  // Every shard on this device, one after another (the NaN replay runs a step over NCCL so too,
  // on rank 0 alone: the same kernels and seeds give the same numbers).
  template <class Before, class After>
  T run_in_turn(const TokenId* in, const TokenId* tgt, uint64_t run_seed, int64_t step,
                Before before, After after) {
    double sum = 0;
    for (int r = 0; r < ranks_; ++r) {
      sum += train_shard(r, in, tgt, run_seed, step, before, after);
      if (ranks_ > 1) stacked_.copy_from(model_.grads(), r * n_, model_.stream());
    }
    if (ranks_ > 1)
      model_.kernels().grad_reduce(model_.next_op_context(), model_.grads().data(), stacked_.data(),
                                   ranks_, n_);
    return T(sum / ranks_);
  }
  // The mean validation loss of a whole batch, shard by shard (no gradients).
  double evaluate(const TokenId* in, const TokenId* tgt) {
    std::vector<double> losses(static_cast<size_t>(ranks_));
    if (comm_ == nullptr) {
      for (int r = 0; r < ranks_; ++r) losses[size_t(r)] = shard_loss(r, in, tgt, false);
    } else {
      const double mine = shard_loss(comm_->world().rank, in, tgt, false);
      comm_->all_gather_host(&mine, losses.data(), sizeof mine, model_.stream());
    }
    double sum = 0;  // in rank order either way
    for (double v : losses) sum += v;
    return sum / ranks_;
  }
  int ranks() const { return ranks_; }
  // Over NCCL: the last step's reports, rank by rank (empty for simulated ranks).
  const std::vector<RankReport>& reports() const {
    static const std::vector<RankReport> none;
    return comm_ ? reports_ : none;
  }
  // The signal the run stops for after this step (0: it goes on): the one that reached this
  // process (simulated ranks), or, over a communicator, the lowest rank's that one reached as
  // the last step's reports say, so that every rank stops alike and records the same signal
  // (the launcher's forwarded SIGINT can reach rank 1 a step before rank 0).
  int stop_requested() const {
    if (comm_ == nullptr) return stop_signal();
    for (const RankReport& r : reports_)
      if (r.stop != 0) return int(r.stop);
    return 0;
  }

 private:
  // Where rank r's micro-batch m starts in the whole batch: shards of M micro-batches each, one
  // after another, every micro-batch the model's batch of sequences.
  int64_t offset(int r, int m) const {
    const int64_t micro = int64_t(model_.batch()) * model_.config().seq_len;
    return (int64_t(r) * model_.micro_batches() + m) * micro;
  }
  // Rank r's shard's mean loss (the model's forward on its sequences of the whole batch, micro-
  // batch by micro-batch; the mean of theirs, in order).
  double shard_loss(int r, const TokenId* in, const TokenId* tgt, bool training) {
    double sum = 0;
    for (int m = 0; m < model_.micro_batches(); ++m) {
      sum += double(model_.forward(in + offset(r, m), tgt + offset(r, m), training));
    }
    return sum / model_.micro_batches();
  }
  // Rank r's forward and backward with its own op seed (its micro-batches' calls drawing the
  // seeds after it in turn): its gradient in the model's buffer.
  template <class Before, class After>
  double train_shard(int r, const TokenId* in, const TokenId* tgt, uint64_t run_seed, int64_t step,
                     Before& before, After& after) {
    before(r);
    model_.reseed(rank_op_seed(run_seed, step, r));
    double sum = 0;
    for (int m = 0; m < model_.micro_batches(); ++m) {
      // The backward is queued before the loss is waited for: no bubble between the two.
      model_.start_step(in + offset(r, m), tgt + offset(r, m), m > 0);
      if (m == 0) after(r);
      sum += double(model_.loss());
    }
    return sum / model_.micro_batches();
  }

  Transformer<T, A>& model_;
  int ranks_;
  Communicator* comm_;
  int64_t n_;
  Buffer<T> stacked_;
  std::vector<RankReport> reports_;
};

// The step's token statistics (every token counted into `counts`). The dose, the most additions
// one embedding row receives from zero: with data-parallel ranks, the largest of the shards'
// (each rank's embedding backward sees its own shard only); micro-batches do not divide it (each
// adds into the rows the one before left).
inline BatchStats dose_of(const TokenId* tokens, int B, int T_, int ranks, int vocab,
                          std::vector<int64_t>* counts) {
  BatchStats whole = batch_stats(tokens, int64_t(B) * T_, vocab, counts);
  if (ranks > 1)
    whole.max_row_contributions = largest_shard_contributions(tokens, B, T_, ranks, vocab);
  return whole;
}

}  // namespace divlab
