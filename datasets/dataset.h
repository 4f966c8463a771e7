// Token streams for training, selected by one spec string everywhere (config `data`, --set data=):
//   uniform      iid uniform token ids
//   zipf:S       iid Zipf(S) over the vocabulary, rank -> id mapping shuffled by the seed
//   markov:S,P   a chain with context: with probability P the next token is the current one's
//                fixed successor (one Zipf(S) draw per token), otherwise a fresh Zipf(S) draw
//                (S = 0: uniform)
//   text:PATH    a UTF-8 file or folder, tokenized with a BPE model trained at the run's vocab
//   brown        the Brown corpus (fetched by scripts/setup.sh into data/brown)
//   english      Brown plus the text under data/english (State of the Union addresses, Moby-Dick,
//                the King James Bible; scripts/setup.sh): ~5.4 M tokens at 4096 pieces, for
//                steps of millions of tokens that should not sample one small corpus many times
// Batches are a pure function of (seed, step): identical on every backend and thread count, and
// a resumed run sees exactly the batches it would have seen.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace divlab {

struct DatasetInfo {
  std::string spec;
  std::string kind;  // uniform | zipf | markov | text
  int vocab = 0;
  std::string corpus_sha256;  // text only
  int64_t corpus_tokens = 0;  // text only: tokens in the training split
  double zipf_exponent = 0;   // fitted (text, zipf) or 0 (uniform)
  // Synthetic streams: the exact entropy rate H(next | current) in nats, the lowest mean loss
  // any model can reach; -1 where unknown (text).
  double entropy_rate = -1;
  std::string tokenizer_model;  // serialized sentencepiece model bytes (text only)
  // Text only: SHA-256 of the token stream (its ids' bytes), the corpus and the tokenizer
  // together. The same corpus and settings give other tokens under another sentencepiece
  // version (0.1.97 and 0.2.0 train different models), so runs are comparable only where this
  // agrees; analyze groups by it.
  std::string tokens_sha256;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Fills inputs[B*T] and targets[B*T] (targets = inputs shifted by one position).
  virtual void batch(int64_t step, int B, int T, TokenId* inputs, TokenId* targets) const = 0;
  // Held-out batches: for text, from the validation tail; for synthetic data, a separate stream.
  virtual void validation_batch(int64_t index, int B, int T, TokenId* inputs,
                                TokenId* targets) const = 0;
  // Probability of each id: exact for synthetic streams, the training split's frequencies for
  // text.
  virtual std::vector<double> unigram() const = 0;
  const DatasetInfo& info() const { return info_; }

 protected:
  DatasetInfo info_;
};

struct DatasetOptions {
  int vocab = 256;
  int seq_len = 32;  // text: both splits must hold a window of seq_len + 1 tokens
  uint64_t seed = 0;
  std::string cache_dir;  // tokenizer cache (text); empty: data/cache under the working dir
  bool verbose = true;    // log tokenizer training / cache reuse to stderr
};

// A data spec read once: its kind and numbers, nothing opened. Throws InputError naming the spec
// where its syntax or a number is wrong (what a config check needs before anything runs).
struct DatasetSpec {
  enum class Kind { Uniform, Zipf, Markov, Text, Brown, English };
  Kind kind = Kind::Uniform;
  double exponent = 0;  // zipf: S > 0; markov: S >= 0
  double follow = 0;    // markov: P in (0, 1)
  std::string path;     // text
};
DatasetSpec parse_dataset_spec(const std::string& spec);
// Throws InputError naming the spec where its corpus is missing: text:PATH that is no file or
// folder, brown or english without its folders (what a run checks before it prints or creates
// anything).
void check_dataset_source(const std::string& spec);

// The file or folder a run of `spec` reads every file of as text (text:PATH's path, english's
// folder of texts), where an output must not go; empty for the other specs.
std::string text_read_whole(const std::string& spec);

// Throws InputError naming the spec or path on bad input.
std::unique_ptr<Dataset> make_dataset(const std::string& spec, const DatasetOptions& opt);

// Per-batch frequency statistics: the dose behind a result.
struct BatchStats {
  int64_t max_row_contributions = 0;  // most occurrences of one id in the batch
  double top1_share = 0;              // that count / batch tokens
};
BatchStats batch_stats(const TokenId* tokens, int64_t n, int vocab, std::vector<int64_t>* counts);
// The most occurrences of one id in any of `ranks` equal shards of B x T tokens: the additions
// the hottest row receives in one data-parallel rank's kernel call (train.ranks; B % ranks == 0).
int64_t largest_shard_contributions(const TokenId* tokens, int B, int T, int ranks, int vocab);

// Least-squares slope s of log p(rank) = c - s log(rank), over the ranks with p > 0 (at least
// two). 0 for a flat distribution.
double fit_zipf_exponent(std::vector<double> probabilities);

// What `divlab data` prints.
struct DatasetSummary {
  int64_t tokens = -1;  // text: tokens in the training split; -1 for unbounded synthetic streams
  double top1_share = 0, top10_share = 0, zipf_exponent = 0;
  // Mean over sampled training batches of B x T tokens of the most occurrences of one id: the
  // additions the hottest embedding-gradient row receives per step.
  double expected_max_row_contributions = 0;
  // The same per kernel call when R data-parallel ranks (train.ranks) each take B / R of the
  // sequences: the mean of each batch's largest shard count (equal to the above for one rank).
  double expected_max_row_contributions_per_rank = 0;
  int64_t batches_sampled = 0;
};
// `ranks` must divide B.
DatasetSummary summarize(const Dataset& data, int B, int T, int batches = 64, int ranks = 1);

}  // namespace divlab
