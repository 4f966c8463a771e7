// Synthetic token streams: uniform, Zipf(S), and the Zipf-skewed Markov chain markov:S,P.
#include "datasets/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/rng.h"
#include "datasets/dataset.h"

namespace divlab {

namespace {
TokenId draw_from_cdf(const std::vector<double>& cdf, double u) {
  const auto i = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
  return TokenId(std::min<int64_t>(i, int64_t(cdf.size()) - 1));
}
}  // namespace

SyntheticDataset::SyntheticDataset(const std::string& spec, int vocab, uint64_t seed, double zipf_s,
                                   double follow_p)
    : vocab_(vocab), seed_(seed), follow_p_(follow_p) {
  info_.spec = spec;
  info_.kind = follow_p > 0 ? "markov" : zipf_s > 0 ? "zipf" : "uniform";
  info_.vocab = vocab;
  Rng rng(seed, kStreamData, ~uint64_t(0));
  if (zipf_s > 0) {
    // cdf over ranks 1..V with p(r) ~ r^-s; rank -> id through a seeded shuffle, so the frequent
    // ids are not always the small ones.
    cdf_.resize(vocab);
    double total = 0;
    for (int r = 0; r < vocab; ++r) cdf_[r] = (total += std::pow(double(r + 1), -zipf_s));
    for (double& c : cdf_) c /= total;
    rank_to_id_.resize(vocab);
    std::iota(rank_to_id_.begin(), rank_to_id_.end(), 0);
    for (int i = vocab - 1; i > 0; --i) std::swap(rank_to_id_[i], rank_to_id_[rng.below(i + 1)]);
  }
  std::vector<double> independent(vocab);
  for (int r = 0; r < vocab; ++r) independent[id_of_rank(r)] = probability_of_rank(r);
  marginal_ = independent;
  if (follow_p > 0) {
    // Successors drawn from the same skewed distribution: hot tokens stay hot.
    successor_.resize(vocab);
    for (auto& s : successor_) s = draw(rng);
    // Stationary distribution pi = (1-p) q + p * (pi pushed through the successors), by fixed
    // point iteration: a contraction with factor p in total variation (at most 2), so after k
    // steps pi is within 2 p^k of the fixed point; rounding may keep the measured change above
    // any threshold at a large vocabulary, so the iteration also stops once 2 p^k < 1e-15.
    const int steps = int(std::ceil(std::log(0.5e-15) / std::log(follow_p)));
    std::vector<double> next(vocab);
    for (int it = 0; it < steps; ++it) {
      for (int v = 0; v < vocab; ++v) next[v] = (1 - follow_p) * independent[v];
      for (int v = 0; v < vocab; ++v) next[successor_[v]] += follow_p * marginal_[v];
      double change = 0;
      for (int v = 0; v < vocab; ++v) change += std::abs(next[v] - marginal_[v]);
      marginal_.swap(next);
      if (change < 1e-15) break;
    }
    start_cdf_.resize(vocab);
    double total = 0;
    for (int v = 0; v < vocab; ++v) start_cdf_[v] = (total += marginal_[v]);
    for (double& c : start_cdf_) c /= total;
  }
  info_.zipf_exponent = fit_zipf_exponent(marginal_);
  // Entropy rate: sum over v of pi(v) H(next | v), where next | v is the independent draw with
  // probability 1 - p, plus p on successor(v) (iid: p = 0, H of the independent draw). Every term
  // of H(next | v) but successor(v)'s is the iid draw's scaled by 1 - p, so each v costs one
  // term's change, not a sum over the vocabulary (which took V^2: 50 s at V = 100 000).
  auto h = [](double x) { return x > 0 ? -x * std::log(x) : 0.0; };
  const double keep = 1 - follow_p;
  double base = 0;
  for (int j = 0; j < vocab; ++j) base += h(keep * independent[j]);
  double rate = base;
  if (follow_p > 0) {
    rate = 0;
    for (int v = 0; v < vocab; ++v) {
      const double q = keep * independent[size_t(successor_[v])];
      rate += marginal_[v] * (base - h(q) + h(q + follow_p));
    }
  }
  info_.entropy_rate = rate;
}

TokenId SyntheticDataset::draw(Rng& rng) const {
  if (cdf_.empty()) return TokenId(rng.below(vocab_));
  return rank_to_id_[draw_from_cdf(cdf_, rng.uniform())];
}

void SyntheticDataset::fill(uint64_t stream, int64_t index, int B, int T, TokenId* in,
                            TokenId* tgt) const {
  for (int b = 0; b < B; ++b) {
    // One generator per sequence: a sequence's tokens do not depend on the batch size around it.
    Rng rng(seed_, stream, uint64_t(index) * 1000003ULL + b);
    TokenId prev = follow_p_ > 0 ? draw_from_cdf(start_cdf_, rng.uniform()) : draw(rng);
    for (int t = 0; t < T; ++t) {
      // Both numbers are drawn at every position (iid streams draw one, as they always have).
      const double u = follow_p_ > 0 ? rng.uniform() : 1.0;
      const TokenId independent = draw(rng);
      const TokenId next = u < follow_p_ ? successor_[prev] : independent;
      in[b * T + t] = prev;
      tgt[b * T + t] = next;
      prev = next;
    }
  }
}

void SyntheticDataset::batch(int64_t step, int B, int T, TokenId* in, TokenId* tgt) const {
  fill(kStreamData, step, B, T, in, tgt);
}
void SyntheticDataset::validation_batch(int64_t index, int B, int T, TokenId* in,
                                        TokenId* tgt) const {
  fill(kStreamEvalData, index, B, T, in, tgt);
}

double SyntheticDataset::probability_of_rank(int rank) const {
  if (cdf_.empty()) return 1.0 / vocab_;
  return cdf_[rank] - (rank ? cdf_[rank - 1] : 0.0);
}

BatchStats batch_stats(const TokenId* tokens, int64_t n, int vocab, std::vector<int64_t>* counts) {
  BatchStats s;
  if (!counts && n < vocab / 8) {
    // Few tokens in a large vocabulary: the longest run of a sorted copy, without a table the
    // vocabulary's size (`divlab data --vocab 10000000` cleared 80 MB a batch).
    std::vector<TokenId> sorted(tokens, tokens + n);
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0, run = 0; i < n; ++i) {
      run = i > 0 && sorted[size_t(i)] == sorted[size_t(i - 1)] ? run + 1 : 1;
      s.max_row_contributions = std::max(s.max_row_contributions, run);
    }
    s.top1_share = n > 0 ? double(s.max_row_contributions) / double(n) : 0.0;
    return s;
  }
  std::vector<int64_t> local(vocab, 0);
  for (int64_t i = 0; i < n; ++i) ++local[tokens[i]];
  s.max_row_contributions = *std::max_element(local.begin(), local.end());
  s.top1_share = double(s.max_row_contributions) / double(n);
  if (counts)
    for (int v = 0; v < vocab; ++v) (*counts)[v] += local[v];
  return s;
}

int64_t largest_shard_contributions(const TokenId* tokens, int B, int T, int ranks, int vocab) {
  const int64_t shard = int64_t(B / ranks) * T;
  int64_t largest = 0;
  for (int r = 0; r < ranks; ++r)
    largest = std::max(
        largest, batch_stats(tokens + r * shard, shard, vocab, nullptr).max_row_contributions);
  return largest;
}

}  // namespace divlab
