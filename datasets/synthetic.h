#pragma once
#include "common/rng.h"
#include "datasets/dataset.h"

namespace divlab {

// Synthetic token streams. Each next token is, with probability follow_p, the current token's
// fixed successor, and otherwise an independent draw (uniform, or Zipf(zipf_s) when zipf_s > 0).
// follow_p = 0 gives iid streams (uniform, zipf:S); follow_p > 0 (markov:S,P) gives text-like
// streams, skewed and with context: predicting the next token needs the current token's
// embedding, which iid streams never do.
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(const std::string& spec, int vocab, uint64_t seed, double zipf_s,
                   double follow_p = 0);
  void batch(int64_t step, int B, int T, TokenId* in, TokenId* tgt) const override;
  void validation_batch(int64_t index, int B, int T, TokenId* in, TokenId* tgt) const override;
  // Probability of the independent draw at frequency rank `rank` (0-based).
  double probability_of_rank(int rank) const;
  // Exact marginal of every position: the independent draw's distribution for iid streams, the
  // chain's stationary distribution otherwise (each sequence starts from it).
  std::vector<double> unigram() const override { return marginal_; }
  TokenId id_of_rank(int rank) const { return rank_to_id_.empty() ? rank : rank_to_id_[rank]; }
  // The token that follows `id` with probability follow_p (markov streams only).
  TokenId successor(TokenId id) const { return successor_[id]; }
  double follow_p() const { return follow_p_; }

 private:
  TokenId draw(Rng& rng) const;
  void fill(uint64_t stream, int64_t index, int B, int T, TokenId* in, TokenId* tgt) const;
  int vocab_;
  uint64_t seed_;
  double follow_p_;
  std::vector<double> cdf_;  // by rank; empty: uniform
  std::vector<TokenId> rank_to_id_;
  std::vector<TokenId> successor_;
  std::vector<double> marginal_;   // by id
  std::vector<double> start_cdf_;  // by id: the marginal's cdf (markov streams only)
};

}  // namespace divlab
