// iid synthetic token streams: uniform and Zipf(S).
#include "datasets/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "datasets/dataset.h"
#include "model/rng.h"

namespace divlab {

IidDataset::IidDataset(const std::string& spec, int vocab, uint64_t seed, double zipf_s)
    : vocab_(vocab), seed_(seed) {
  info_.spec = spec;
  info_.kind = zipf_s > 0 ? "zipf" : "uniform";
  info_.vocab = vocab;
  if (zipf_s > 0) {
    // cdf over ranks 1..V with p(r) ~ r^-s; rank -> id through a seeded shuffle, so the frequent
    // ids are not always the small ones.
    cdf_.resize(vocab);
    double total = 0;
    for (int r = 0; r < vocab; ++r) cdf_[r] = (total += std::pow(double(r + 1), -zipf_s));
    for (double& c : cdf_) c /= total;
    rank_to_id_.resize(vocab);
    std::iota(rank_to_id_.begin(), rank_to_id_.end(), 0);
    Rng rng(seed, kStreamData, ~uint64_t(0));
    for (int i = vocab - 1; i > 0; --i) std::swap(rank_to_id_[i], rank_to_id_[rng.below(i + 1)]);
  }
  info_.zipf_exponent = fit_zipf_exponent(unigram());
}

TokenId IidDataset::draw(Rng& rng) const {
  if (cdf_.empty()) return TokenId(rng.below(vocab_));
  const double u = rng.uniform();
  const int rank = int(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  return rank_to_id_[std::min(rank, vocab_ - 1)];
}

void IidDataset::fill(uint64_t stream, int64_t index, int B, int T, TokenId* in,
                      TokenId* tgt) const {
  for (int b = 0; b < B; ++b) {
    // One generator per sequence: a sequence's tokens do not depend on the batch size around it.
    Rng rng(seed_, stream, uint64_t(index) * 1000003ULL + b);
    TokenId prev = draw(rng);
    for (int t = 0; t < T; ++t) {
      const TokenId next = draw(rng);
      in[b * T + t] = prev;
      tgt[b * T + t] = next;
      prev = next;
    }
  }
}

void IidDataset::batch(int64_t step, int B, int T, TokenId* in, TokenId* tgt) const {
  fill(kStreamData, step, B, T, in, tgt);
}
void IidDataset::validation_batch(int64_t index, int B, int T, TokenId* in, TokenId* tgt) const {
  fill(kStreamEvalData, index, B, T, in, tgt);
}

double IidDataset::probability_of_rank(int rank) const {
  if (cdf_.empty()) return 1.0 / vocab_;
  return cdf_[rank] - (rank ? cdf_[rank - 1] : 0.0);
}

std::vector<double> IidDataset::unigram() const {
  std::vector<double> p(vocab_);
  for (int r = 0; r < vocab_; ++r) p[id_of_rank(r)] = probability_of_rank(r);
  return p;
}

BatchStats batch_stats(const TokenId* tokens, int64_t n, int vocab, std::vector<int64_t>* counts) {
  std::vector<int64_t> local(vocab, 0);
  for (int64_t i = 0; i < n; ++i) ++local[tokens[i]];
  BatchStats s;
  s.max_row_contributions = *std::max_element(local.begin(), local.end());
  s.top1_share = double(s.max_row_contributions) / double(n);
  if (counts)
    for (int v = 0; v < vocab; ++v) (*counts)[v] += local[v];
  return s;
}

}  // namespace divlab
