// Real text: reading a corpus, a cached BPE tokenizer (sentencepiece), and the token stream.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "datasets/dataset.h"

namespace divlab {

struct Corpus {
  std::string source;              // what the user named (text:PATH, "brown", "english")
  std::vector<std::string> lines;  // non-empty lines (Brown: one sentence per line, tags removed)
  std::string sha256;  // of the lines joined by '\n': the corpus identity in cache keys and traces
  int64_t bytes = 0;
};

// A UTF-8 file, or every regular file under a folder (sorted, hidden files skipped). Throws
// InputError naming the path for a missing or empty corpus, NUL bytes, or invalid UTF-8 (with
// the byte offset).
Corpus read_text_corpus(const std::string& path);
// The Brown corpus folder as fetched by scripts/setup.sh: files c[a-r]NN of word/tag tokens.
Corpus read_brown_corpus(const std::string& dir);
// Brown's lines, then every file under <data>/english as text:PATH reads a folder (both fetched
// by scripts/setup.sh).
Corpus read_english_corpus(const std::string& data);
// <data>/english: the folder of texts `english` adds to Brown.
std::string english_folder(const std::string& data);
// The first checks of the three above, reading no file: the path is a file or folder (text;
// returns whether it is a folder), the folders open (brown, english). Throw InputError as they do.
bool check_text_source(const std::string& path);
void check_brown_source(const std::string& dir);
void check_english_source(const std::string& data);

// Where data lives: $DIVLAB_DATA, else the source tree's data/ folder. The tokenizer cache is
// $DIVLAB_CACHE, else <data>/cache.
std::string data_dir();
std::string cache_dir();

struct TokenizedCorpus {
  std::vector<TokenId> tokens;  // every line's pieces followed by the end-of-line id
  std::string model;            // serialized sentencepiece model
  std::string tokens_sha256;    // of the tokens' bytes, as the cache records it
  bool from_cache = false;
};

// BPE at `vocab` pieces with settings that make decode(encode(line)) == line for the corpus'
// characters (identity normalisation, whitespace kept, full character coverage). Cached under
// cache_dir() by sha256(corpus, vocab, settings); a second call reads the cache and logs it. A
// damaged entry (a model that does not load at `vocab` pieces, an id outside the vocabulary,
// tokens whose SHA-256 is not the one recorded) is said on stderr and trained again.
// `accept(tokens)` may throw InputError; it runs before anything is cached or logged, so a
// rejected corpus leaves no files behind.
TokenizedCorpus tokenize_cached(const Corpus& corpus, int vocab, const std::string& cache,
                                bool verbose,
                                const std::function<void(int64_t tokens)>& accept = nullptr);

// For tests: encode / decode with a serialized model.
std::vector<int> bpe_encode(const std::string& model, const std::string& text);
std::string bpe_decode(const std::string& model, const std::vector<int>& ids);

class TextDataset : public Dataset {
 public:
  // `seq_len` is checked against both splits. The last 5 % of tokens (at least seq_len + 1) are
  // the validation split; training windows never reach into it.
  TextDataset(const std::string& spec, const Corpus& corpus, const DatasetOptions& opt);
  void batch(int64_t step, int B, int T, TokenId* in, TokenId* tgt) const override;
  void validation_batch(int64_t index, int B, int T, TokenId* in, TokenId* tgt) const override;
  std::vector<double> unigram() const override;
  int64_t train_tokens() const { return train_end_; }
  int64_t validation_tokens() const { return int64_t(tokens_.size()) - train_end_; }

 private:
  void windows(uint64_t stream, int64_t index, int64_t begin, int64_t end, int B, int T,
               TokenId* in, TokenId* tgt) const;
  std::vector<TokenId> tokens_;
  int64_t train_end_ = 0;
  uint64_t seed_;
};

}  // namespace divlab
