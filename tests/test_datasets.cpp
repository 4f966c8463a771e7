// Token streams: the Zipf sampler's fit, uniform's flatness, the Markov chain's statistics, BPE
// round trip and cache, splits.
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "datasets/synthetic.h"
#include "datasets/text.h"
#include "experiments/config.h"
#include "tests/support/check.h"
#include "tests/support/fixtures.h"

namespace divlab {
using namespace testing;

namespace {
std::vector<int64_t> sample_counts(const Dataset& d, int vocab, int batches, int B, int T) {
  std::vector<TokenId> in(B * T), tgt(B * T);
  std::vector<int64_t> counts(vocab, 0);
  for (int s = 0; s < batches; ++s) {
    d.batch(s, B, T, in.data(), tgt.data());
    batch_stats(in.data(), B * T, vocab, &counts);
  }
  return counts;
}

// Upper alpha = 1e-6 quantile of chi-square(df), Wilson-Hilferty approximation. The tests draw
// fresh seeds every run, so alpha is a false-alarm rate per run: at 0.001, with three such
// comparisons, a clean-clone CI run failed (seed 9697604072238987563: 154.2 against 148.3, 100
// bins; 0 of 300 runs after). A distribution that is wrong (a start drawn uniformly, a chain
// that has not mixed) misses by thousands, far past either quantile (181.1 at 100 bins).
double chi2_critical(int df) {
  const double z = 4.753424, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Pearson chi-square of observed id counts against probabilities; ids with expected count < 5
// are pooled into one bin. Returns {statistic, bins}.
std::pair<double, int> chi_square(const std::vector<int64_t>& observed,
                                  const std::vector<double>& p, double n) {
  double chi2 = 0, tail_obs = 0, tail_exp = 0;
  int bins = 0;
  for (size_t v = 0; v < p.size(); ++v) {
    const double e = n * p[v], o = double(observed[v]);
    if (e < 5) {
      tail_obs += o, tail_exp += e;
      continue;
    }
    chi2 += (o - e) * (o - e) / e, ++bins;
  }
  if (tail_exp > 0) chi2 += (tail_obs - tail_exp) * (tail_obs - tail_exp) / tail_exp, ++bins;
  return {chi2, bins};
}
}  // namespace

TEST(Zipf, SamplerMatchesTargetFrequencies) {
  // Fixed seed: a goodness-of-fit test at chi2_critical's quantile (Pearson chi-square; tail
  // ranks with expected count < 5 pooled into one bin).
  const int V = 200;
  SyntheticDataset d("zipf:1.1", V, 12345, 1.1);
  const auto counts = sample_counts(d, V, 400, 8, 64);
  std::vector<double> p(V);
  for (int r = 0; r < V; ++r) p[d.id_of_rank(r)] = d.probability_of_rank(r);
  const auto [chi2, bins] = chi_square(counts, p, 400.0 * 8 * 64);
  EXPECT_LT(chi2, chi2_critical(bins - 1)) << bins << " bins";
  // And it is really skewed: the top rank takes about 1 / H(V, 1.1) of all tokens.
  EXPECT_GT(counts[d.id_of_rank(0)], 20 * counts[d.id_of_rank(V / 2)]);
}

TEST(Zipf, FittedExponentRecoversTheTarget) {
  for (double s : {0.6, 1.1, 1.5}) {
    SyntheticDataset d("zipf", 1000, 1, s);
    EXPECT_NEAR(d.info().zipf_exponent, s, 1e-9);
  }
  EXPECT_NEAR(SyntheticDataset("uniform", 1000, 1, 0.0).info().zipf_exponent, 0.0, 1e-12);
}

TEST(Uniform, NoIdAboveMeanPlusSixSigma) {
  const int V = 512;
  SyntheticDataset d("uniform", V, test_seed(), 0.0);
  const auto counts = sample_counts(d, V, 200, 8, 64);
  const double n = 200.0 * 8 * 64, p = 1.0 / V;
  const double mean = n * p, sigma = std::sqrt(n * p * (1 - p));
  EXPECT_LT(*std::max_element(counts.begin(), counts.end()), mean + 6 * sigma);
  EXPECT_GT(*std::min_element(counts.begin(), counts.end()), mean - 6 * sigma);
}

// Few tokens in a large vocabulary take the sorted path; it must count as the table does.
TEST(Batches, StatsOfFewTokensInALargeVocabularyMatchTheTable) {
  const uint64_t seed = testing::test_seed();
  std::mt19937_64 gen(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const int vocab = 1000 + int(gen() % 100000), n = 1 + int(gen() % 100);
    std::vector<TokenId> tokens(size_t(n), 0);
    for (auto& t : tokens) t = TokenId(gen() % (trial % 2 ? 5 : uint64_t(vocab)));
    std::vector<int64_t> counts(size_t(vocab), 0);
    const BatchStats table = batch_stats(tokens.data(), n, vocab, &counts);
    const BatchStats sorted = batch_stats(tokens.data(), n, vocab, nullptr);
    EXPECT_EQ(sorted.max_row_contributions, table.max_row_contributions) << "seed " << seed;
    EXPECT_EQ(sorted.top1_share, table.top1_share) << "seed " << seed;
  }
}

TEST(Batches, PureFunctionOfSeedAndStep) {
  SyntheticDataset a("zipf:1.1", 300, 7, 1.1), b("zipf:1.1", 300, 7, 1.1),
      c("zipf:1.1", 300, 8, 1.1);
  std::vector<TokenId> x(256), y(256), t(256);
  a.batch(5, 4, 64, x.data(), t.data());
  b.batch(5, 4, 64, y.data(), t.data());
  EXPECT_EQ(x, y);
  c.batch(5, 4, 64, y.data(), t.data());
  EXPECT_NE(x, y);
}

TEST(Markov, FirstAndLastPositionsFollowTheStationaryDistribution) {
  // Sequences are independent of each other, so one position across many sequences is an iid
  // sample: the start (drawn from the marginal) and the last step of the chain must both fit it.
  const int V = 100, B = 64, T = 32, batches = 300;
  const uint64_t seed = test_seed();
  SyntheticDataset d("markov:1.1,0.7", V, seed, 1.1, 0.7);
  const std::vector<double> pi = d.unigram();
  double total = 0;
  for (double x : pi) total += x;
  EXPECT_NEAR(total, 1.0, 1e-12);
  std::vector<int64_t> first(V, 0), last(V, 0);
  std::vector<TokenId> in(B * T), tgt(B * T);
  for (int s = 0; s < batches; ++s) {
    d.batch(s, B, T, in.data(), tgt.data());
    for (int b = 0; b < B; ++b) ++first[in[b * T]], ++last[tgt[b * T + T - 1]];
  }
  for (const auto* counts : {&first, &last}) {
    const auto [chi2, bins] = chi_square(*counts, pi, double(B) * batches);
    EXPECT_LT(chi2, chi2_critical(bins - 1)) << bins << " bins, seed " << seed;
  }
}

TEST(Markov, NextTokenIsTheSuccessorWithTheStatedProbability) {
  // P(next = successor(v) | v) = P + (1 - P) q(successor(v)), q the independent Zipf draw's
  // probability. Checked per id with >= 2000 occurrences, within 5 binomial standard deviations.
  const int V = 64, B = 64, T = 64;
  const double P = 0.6;
  const uint64_t seed = test_seed();
  SyntheticDataset d("markov:1.0,0.6", V, seed, 1.0, P);
  std::vector<double> q(V);
  for (int r = 0; r < V; ++r) q[d.id_of_rank(r)] = d.probability_of_rank(r);
  std::vector<int64_t> seen(V, 0), followed(V, 0);
  std::vector<TokenId> in(B * T), tgt(B * T);
  for (int s = 0; s < 100; ++s) {
    d.batch(s, B, T, in.data(), tgt.data());
    for (int i = 0; i < B * T; ++i) {
      ++seen[in[i]];
      followed[in[i]] += tgt[i] == d.successor(in[i]);
      if (i % T) {
        EXPECT_EQ(in[i], tgt[i - 1]);  // targets are the inputs shifted by one
      }
    }
  }
  int checked = 0;
  for (int v = 0; v < V; ++v) {
    if (seen[v] < 2000) continue;
    const double p = P + (1 - P) * q[d.successor(v)], n = double(seen[v]);
    EXPECT_NEAR(double(followed[v]) / n, p, 5 * std::sqrt(p * (1 - p) / n))
        << "id " << v << ", seed " << seed;
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(Markov, SkewedLikeItsZipfDrawAndIidStreamsUnchanged) {
  // The chain keeps its tokens skewed (successors are Zipf draws too): the hottest id takes more
  // than a tenth of the stream at V = 64, as Zipf(1.1) does.
  const uint64_t seed = test_seed();
  const SyntheticDataset m("markov:1.1,0.5", 64, seed, 1.1, 0.5);
  const auto pi = m.unigram();
  EXPECT_GT(*std::max_element(pi.begin(), pi.end()), 0.1) << "seed " << seed;
  // follow_p = 0 is the plain iid stream, batch for batch.
  const SyntheticDataset a("zipf:1.1", 64, seed, 1.1), b("zipf:1.1", 64, seed, 1.1, 0.0);
  std::vector<TokenId> x(256), y(256), t(256);
  a.batch(3, 4, 64, x.data(), t.data());
  b.batch(3, 4, 64, y.data(), t.data());
  EXPECT_EQ(x, y);
}

TEST(Markov, EntropyRateMatchesTheBigramEntropyOfASample) {
  // The exact H(next | current) against the plug-in estimate from ~1.2 M sampled transitions
  // (bias about cells / 2n = 256 / 2.4e6 nats, far below the tolerance).
  const int V = 16, B = 64, T = 64;
  const uint64_t seed = test_seed();
  const SyntheticDataset d("markov:1.1,0.6", V, seed, 1.1, 0.6);
  std::vector<double> pairs(V * V, 0.0), from(V, 0.0);
  std::vector<TokenId> in(B * T), tgt(B * T);
  double n = 0;
  for (int s = 0; s < 300; ++s) {
    d.batch(s, B, T, in.data(), tgt.data());
    for (int i = 0; i < B * T; ++i) ++pairs[in[i] * V + tgt[i]], ++from[in[i]], ++n;
  }
  double h = 0;
  for (int v = 0; v < V; ++v)
    for (int j = 0; j < V; ++j)
      if (pairs[v * V + j] > 0) h -= pairs[v * V + j] / n * std::log(pairs[v * V + j] / from[v]);
  EXPECT_NEAR(d.info().entropy_rate, h, 0.01) << "seed " << seed;
  // Context lowers it below the marginal's entropy; uniform iid tokens have exactly ln V.
  double marginal = 0;
  for (double p : d.unigram()) marginal -= p > 0 ? p * std::log(p) : 0.0;
  EXPECT_LT(d.info().entropy_rate, marginal - 0.1);
  EXPECT_NEAR(SyntheticDataset("uniform", 300, seed, 0.0).info().entropy_rate, std::log(300.0),
              1e-12);
}

class Text : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("text");
    corpus_path_ = dir_ + "/corpus.txt";
    write_fixture(corpus_path_, 3000, 99);
  }
  DatasetOptions options(const std::string& cache) const {
    DatasetOptions o;
    o.vocab = 300, o.seq_len = 32, o.seed = 3, o.cache_dir = cache, o.verbose = false;
    return o;
  }
  std::string dir_, corpus_path_;
};

TEST_F(Text, TokenizerRoundTripsCorpusLines) {
  const Corpus c = read_text_corpus(corpus_path_);
  const TokenizedCorpus t = tokenize_cached(c, 300, dir_ + "/cache", false);
  for (size_t i = 0; i < c.lines.size(); i += 97)
    EXPECT_EQ(bpe_decode(t.model, bpe_encode(t.model, c.lines[i])), c.lines[i]);
  // Every id is inside the vocabulary.
  EXPECT_LT(*std::max_element(t.tokens.begin(), t.tokens.end()), 300);
}

TEST_F(Text, CacheIsReusedAndIdentical) {
  const Corpus c = read_text_corpus(corpus_path_);
  const TokenizedCorpus first = tokenize_cached(c, 300, dir_ + "/cache", false);
  const TokenizedCorpus second = tokenize_cached(c, 300, dir_ + "/cache", false);
  EXPECT_FALSE(first.from_cache);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(first.tokens, second.tokens);
  EXPECT_EQ(first.model, second.model);
  // Another vocabulary is another cache entry.
  EXPECT_FALSE(tokenize_cached(c, 280, dir_ + "/cache", false).from_cache);
}

// The cache is derived data that outlives the run that wrote it: copied between machines, cut
// short, edited. An entry that would train on something else than its corpus (an id past the
// vocabulary crashed the run as it indexed the embedding; tokens cut short at a whole id are
// another data set) is trained again and replaced; one written before the recorded hash gets it.
TEST_F(Text, ADamagedCacheEntryIsTrainedAgainAndReplaced) {
  const Corpus c = read_text_corpus(corpus_path_);
  const std::string cache = dir_ + "/damaged";
  const TokenizedCorpus good = tokenize_cached(c, 300, cache, false);
  std::string stem;
  for (const auto& e : std::filesystem::directory_iterator(cache))
    if (e.path().extension() == ".model")
      stem = e.path().string().substr(0, e.path().string().size() - 6);
  ASSERT_FALSE(stem.empty());
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const auto put = [](const std::string& path, const std::string& b) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  };
  const std::string tokens = bytes(stem + ".tokens"), model = bytes(stem + ".model");
  ASSERT_EQ(good.tokens_sha256 + "\n", bytes(stem + ".sha256"));
  const auto with_id = [&](size_t at, TokenId id) {
    std::string t = tokens;
    std::memcpy(&t[at * sizeof(TokenId)], &id, sizeof id);
    return t;
  };
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> damages = {
      {"an id past the vocabulary", {".tokens", with_id(17, 300)}},
      {"a negative id", {".tokens", with_id(good.tokens.size() - 1, -5)}},
      {"cut short by one id", {".tokens", tokens.substr(0, tokens.size() - sizeof(TokenId))}},
      {"cut inside an id", {".tokens", tokens.substr(0, tokens.size() - 1)}},
      {"no tokens", {".tokens", ""}},
      {"a model cut short", {".model", model.substr(0, model.size() / 2)}},
      {"another vocabulary's model", {".model", tokenize_cached(c, 280, cache, false).model}}};
  for (const auto& [what, damage] : damages) {
    put(stem + damage.first, damage.second);
    const TokenizedCorpus again = tokenize_cached(c, 300, cache, false);
    EXPECT_FALSE(again.from_cache) << what;
    EXPECT_EQ(again.tokens, good.tokens) << what;
    EXPECT_EQ(again.model, good.model) << what;
    EXPECT_EQ(bytes(stem + ".tokens"), tokens) << what << ": not replaced";
    EXPECT_TRUE(tokenize_cached(c, 300, cache, false).from_cache) << what;
  }
  std::filesystem::remove(stem + ".sha256");  // an entry older than its recorded hash
  const TokenizedCorpus older = tokenize_cached(c, 300, cache, false);
  EXPECT_TRUE(older.from_cache);
  EXPECT_EQ(older.tokens_sha256, good.tokens_sha256);
  EXPECT_EQ(bytes(stem + ".sha256"), good.tokens_sha256 + "\n");
}

TEST_F(Text, TokenizationIdenticalForOneAndTwoThreads) {
  const Corpus c = read_text_corpus(corpus_path_);
  omp_set_num_threads(1);
  const TokenizedCorpus one = tokenize_cached(c, 300, dir_ + "/cache1", false);
  omp_set_num_threads(2);
  const TokenizedCorpus two = tokenize_cached(c, 300, dir_ + "/cache2", false);
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(one.tokens, two.tokens);
  EXPECT_EQ(one.model, two.model);
}

TEST_F(Text, TrainingAndValidationWindowsStayInTheirSplits) {
  TextDataset d("text:" + corpus_path_, read_text_corpus(corpus_path_), options(dir_ + "/c"));
  const Corpus c = read_text_corpus(corpus_path_);
  const std::vector<TokenId> all = tokenize_cached(c, 300, dir_ + "/c", false).tokens;
  const int64_t split = d.train_tokens();
  ASSERT_GT(d.validation_tokens(), 32);
  std::vector<TokenId> in(4 * 32), tgt(4 * 32);
  auto where = [&](const TokenId* w) {  // first offset of the 33-token window in the stream
    std::vector<TokenId> win(w, w + 32);
    return std::search(all.begin(), all.end(), win.begin(), win.end()) - all.begin();
  };
  for (int s = 0; s < 20; ++s) {
    d.batch(s, 4, 32, in.data(), tgt.data());
    for (int b = 0; b < 4; ++b) {
      EXPECT_EQ(in[b * 32 + 1], tgt[b * 32]);  // targets are inputs shifted by one
      const int64_t at = where(&in[b * 32]);
      EXPECT_LE(at + 33, split) << "training window reaches the validation tail";
    }
    d.validation_batch(s, 4, 32, in.data(), tgt.data());
    for (int b = 0; b < 4; ++b) {
      // The window may also occur earlier by chance; it must occur inside the tail.
      std::vector<TokenId> win(&in[b * 32], &in[b * 32] + 32);
      const auto it = std::search(all.begin() + split, all.end(), win.begin(), win.end());
      EXPECT_NE(it, all.end()) << "validation window outside the tail";
    }
  }
}

// `english` is Brown's lines (tags stripped) and then every file under <data>/english, as
// text:PATH reads a folder, in sorted order; without either folder it names the spec and path.
TEST_F(Text, EnglishIsBrownThenTheEnglishFolder) {
  const std::string data = dir_ + "/data";
  for (const char* d : {"", "/brown", "/english", "/english/b-part", "/english/a-part"})
    ASSERT_EQ(mkdir((data + d).c_str(), 0755), 0) << d;
  const auto write = [&](const std::string& path, const std::string& text) {
    std::ofstream(data + path) << text;
  };
  write("/brown/ca01", "The/at jury/nn said/vbd ./.\n\nIt/pps ended/vbd ./.\n");
  write("/brown/README", "not a Brown text file\n");
  write("/english/b-part/z.txt", "from b\n");
  write("/english/a-part/y.txt", "from a, first\n\nsecond line\n");
  const Corpus c = read_english_corpus(data);
  EXPECT_EQ(c.source, "english");
  EXPECT_EQ(c.lines, (std::vector<std::string>{"The jury said .", "It ended .", "from a, first",
                                               "second line", "from b"}));
  EXPECT_NE(c.sha256, read_brown_corpus(data + "/brown").sha256);
  for (const char* missing : {"/english", "/brown"}) {
    ASSERT_EQ(std::rename((data + missing).c_str(), (data + missing + ".away").c_str()), 0);
    try {
      read_english_corpus(data);
      ADD_FAILURE() << "expected InputError without " << missing;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("data = 'english': corpus not found at '" + data +
                                           missing + "'"),
                std::string::npos)
          << e.what();
    }
    ASSERT_EQ(std::rename((data + missing + ".away").c_str(), (data + missing).c_str()), 0);
  }
}

// sentencepiece's BPE trainer ends the process on a word past 65 535 characters (a line of
// base64 or minified JSON, say): such lines are left out of its training and still tokenized.
TEST_F(Text, ALineWithAWordPast64KCharactersIsTokenizedNotTrainedOn) {
  Corpus c = read_text_corpus(corpus_path_);
  const TokenizedCorpus plain = tokenize_cached(c, 300, dir_ + "/plain", false);
  std::string word;
  for (int i = 0; i < 70000; ++i) word += i % 2 ? "é" : "k";  // 70 000 characters, 105 000 bytes
  c.lines.push_back("ka lo " + word + " mi");
  const TokenizedCorpus t = tokenize_cached(c, 300, dir_ + "/cache", false);
  EXPECT_EQ(t.model, plain.model) << "the line changed what the tokenizer learned";
  EXPECT_EQ(bpe_decode(t.model, bpe_encode(t.model, c.lines.back())), c.lines.back());
  EXPECT_GT(t.tokens.size(), plain.tokens.size() + 1000);
}

TEST_F(Text, TooLargeVocabularyIsRejected) {
  // The fixture has ~600 words: no BPE model reaches 20000 pieces.
  try {
    tokenize_cached(read_text_corpus(corpus_path_), 20000, dir_ + "/cache", false);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.vocab = 20000"), std::string::npos) << e.what();
  }
}
}  // namespace divlab
