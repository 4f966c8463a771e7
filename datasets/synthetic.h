#pragma once
#include "datasets/dataset.h"
#include "model/rng.h"

namespace divlab {

// iid tokens; zipf_s = 0 means uniform.
class IidDataset : public Dataset {
 public:
  IidDataset(const std::string& spec, int vocab, uint64_t seed, double zipf_s);
  void batch(int64_t step, int B, int T, TokenId* in, TokenId* tgt) const override;
  void validation_batch(int64_t index, int B, int T, TokenId* in, TokenId* tgt) const override;
  // Target probability of the id at frequency rank `rank` (0-based), for goodness-of-fit tests.
  double probability_of_rank(int rank) const;
  std::vector<double> unigram() const override;
  TokenId id_of_rank(int rank) const { return rank_to_id_.empty() ? rank : rank_to_id_[rank]; }

 private:
  TokenId draw(Rng& rng) const;
  void fill(uint64_t stream, int64_t index, int B, int T, TokenId* in, TokenId* tgt) const;
  int vocab_;
  uint64_t seed_;
  std::vector<double> cdf_;
  std::vector<TokenId> rank_to_id_;
};

}  // namespace divlab
