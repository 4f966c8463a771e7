#include "datasets/text.h"

#include <dirent.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "common/files.h"
#include "common/paths.h"
#include "common/process.h"
#include "common/rng.h"
#include "common/sha256.h"
#include "common/signals.h"
#include "common/utf8.h"

namespace divlab {

// Bump when anything below changes what a cached tokenizer or token file contains.
constexpr const char* kTokenizerSettings =
    "bpe-v1 identity-normalisation keep-whitespace coverage=1.0 unk=0 eos=1 no-bos";
constexpr TokenId kEndOfLine = 1;
constexpr double kValidationFraction = 0.05;

std::string data_dir() {
  const char* env = std::getenv("DIVLAB_DATA");
  return env && *env ? env : resource_path("data");
}
std::string cache_dir() {
  const char* env = std::getenv("DIVLAB_CACHE");
  if (env && *env) return env;
  // Beside the data, unless that is an installed, read-only share/divlab: then the user's cache.
  if (access(data_dir().c_str(), W_OK) == 0) return data_dir() + "/cache";
  const char *xdg = std::getenv("XDG_CACHE_HOME"), *home = std::getenv("HOME");
  if (xdg && *xdg) return std::string(xdg) + "/divlab";
  return home && *home ? std::string(home) + "/.cache/divlab" : data_dir() + "/cache";
}

namespace {

std::string read_corpus_file(const std::string& path) {
  std::string text;
  if (!read_file(path, text)) throw InputError("corpus file '" + path + "': cannot be read");
  return text;
}

// Every regular file under `dir`, in sorted order. Folders are followed through symlinks, but
// a folder reached twice (a link to a parent, two links to one place) is refused, and so is
// anything that is neither a file nor a folder (a FIFO or device would block or never end).
void list_files(const std::string& dir, std::vector<std::string>& out,
                std::set<std::pair<dev_t, ino_t>>& seen) {
  struct stat self {};
  if (stat(dir.c_str(), &self) != 0 || !seen.insert({self.st_dev, self.st_ino}).second)
    throw InputError("corpus folder '" + dir +
                     "': reached twice (a symlink loop, or two links to one folder)");
  DIR* d = opendir(dir.c_str());
  if (!d) throw InputError("corpus folder '" + dir + "': cannot be read");
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    const std::string p = dir + "/" + n;
    struct stat st {};
    if (stat(p.c_str(), &st) != 0) throw InputError("corpus file '" + p + "': cannot be read");
    if (S_ISDIR(st.st_mode))
      list_files(p, out, seen);
    else if (S_ISREG(st.st_mode))
      out.push_back(p);
    else
      throw InputError("corpus file '" + p + "': not a regular file or folder");
  }
}

void add_lines(Corpus& c, const std::string& text, const std::string& path) {
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string::npos)
    throw InputError("corpus file '" + path + "': not UTF-8 text (" +
                     (text[bad] == 0 ? "NUL byte" : "invalid UTF-8") + " at byte " +
                     std::to_string(bad) + ")");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) c.lines.push_back(line);
  }
  c.bytes += int64_t(text.size());
}

// Every file under `dir` (sorted, hidden ones skipped), its lines appended to `c`.
void add_folder(Corpus& c, const std::string& dir) {
  std::vector<std::string> files;
  std::set<std::pair<dev_t, ino_t>> seen;
  list_files(dir, files, seen);
  for (const auto& f : files) add_lines(c, read_corpus_file(f), f);
}

void finish(Corpus& c, const std::string& what) {
  if (c.lines.empty()) throw InputError(what + ": the corpus is empty (no non-blank lines)");
  std::string joined;
  for (const auto& l : c.lines) joined += l, joined += '\n';
  c.sha256 = sha256_hex(joined);
}

// "The/at Fulton/np-tl ..." -> "The Fulton ...": each token loses its last "/tag".
std::string strip_brown_tags(const std::string& line) {
  std::string out;
  std::istringstream in(line);
  std::string tok;
  while (in >> tok) {
    const auto slash = tok.rfind('/');
    if (slash != std::string::npos && slash > 0) tok.resize(slash);
    if (!out.empty()) out += ' ';
    out += tok;
  }
  return out;
}

// sentencepiece's BPE trainer keeps a position inside a word (the characters between two
// spaces) in 16 bits and ends the process past that (bpe_model_trainer.h: r <= 65535).
constexpr size_t kMaxTrainingWord = 65535;

// Whether a line has a word the trainer cannot hold (more characters than kMaxTrainingWord).
bool has_overlong_word(const std::string& line) {
  size_t chars = 0;
  for (const char c : line) {
    if (c == ' ')
      chars = 0;
    else if ((static_cast<unsigned char>(c) & 0xC0) != 0x80 && ++chars > kMaxTrainingWord)
      return true;  // a UTF-8 sequence's first byte: one more character
  }
  return false;
}

// The lines the tokenizer trains on: all but those with a word it cannot hold (the tokenizer
// still encodes them).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& lines) : lines_(lines) { skip(); }
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override {
    ++i_;
    skip();
  }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void skip() {
    while (i_ < lines_.size() && has_overlong_word(lines_[i_])) ++i_;
  }
  const std::vector<std::string>& lines_;
  size_t i_ = 0;
};

void make_dirs(const std::string& path) {
  for (size_t p = 1; p <= path.size(); ++p)
    if (p == path.size() || path[p] == '/') mkdir(path.substr(0, p).c_str(), 0755);
}

}  // namespace

bool check_text_source(const std::string& path) {
  struct stat st {};
  if (path.empty() || stat(path.c_str(), &st) != 0)
    throw InputError("data = 'text:" + path + "': no such file or folder");
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
    throw InputError("data = 'text:" + path +
                     "': not a regular file or folder (a pipe or device would never end)");
  return S_ISDIR(st.st_mode);
}

Corpus read_text_corpus(const std::string& path) {
  Corpus c;
  c.source = "text:" + path;
  if (check_text_source(path))
    add_folder(c, path);
  else
    add_lines(c, read_corpus_file(path), path);
  finish(c, "data = 'text:" + path + "'");
  return c;
}

namespace {
// `spec` names the data spec in the message: brown, or english, which reads Brown too.
DIR* open_corpus_folder(const std::string& dir, const std::string& spec) {
  DIR* d = opendir(dir.c_str());
  if (!d)
    throw InputError("data = '" + spec + "': corpus not found at '" + dir +
                     "' (scripts/setup.sh fetches it; DIVLAB_DATA points elsewhere)");
  return d;
}

Corpus read_brown_lines(const std::string& dir, const std::string& spec) {
  Corpus c;
  std::vector<std::string> files;
  DIR* d = open_corpus_folder(dir, spec);
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;  // ca01 ... cr09
    if (n.size() == 4 && n[0] == 'c' && n[1] >= 'a' && n[1] <= 'r' && isdigit(n[2]))
      files.push_back(dir + "/" + n);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    Corpus raw;
    add_lines(raw, read_corpus_file(f), f);
    for (const auto& l : raw.lines) c.lines.push_back(strip_brown_tags(l));
    c.bytes += raw.bytes;
  }
  return c;
}
}  // namespace

std::string english_folder(const std::string& data) {
  return data + "/english";
}

void check_brown_source(const std::string& dir) {
  closedir(open_corpus_folder(dir, "brown"));
}

void check_english_source(const std::string& data) {
  for (const std::string& dir : {data + "/brown", english_folder(data)})
    closedir(open_corpus_folder(dir, "english"));
}

Corpus read_brown_corpus(const std::string& dir) {
  Corpus c = read_brown_lines(dir, "brown");
  c.source = "brown";
  finish(c, "data = 'brown' ('" + dir + "')");
  return c;
}

Corpus read_english_corpus(const std::string& data) {
  check_english_source(data);
  Corpus c = read_brown_lines(data + "/brown", "english");
  c.source = "english";
  add_folder(c, english_folder(data));
  finish(c, "data = 'english' ('" + data + "/brown', '" + english_folder(data) + "')");
  return c;
}

namespace {
// The longest line, in bytes, sentencepiece's trainer reads (longer ones it skips).
constexpr size_t kMaxTrainingLine = 1000000;

// sentencepiece's BPE trainer with divlab's settings (kTokenizerSettings names them in cache keys).
void train_bpe(const std::vector<std::string>& lines, int vocab, std::string* model,
               sentencepiece::util::Status* status) {
  LineIterator it(lines);
  *status = sentencepiece::SentencePieceTrainer::Train(
      {{"model_type", "bpe"},
       {"vocab_size", std::to_string(vocab)},
       {"character_coverage", "1.0"},
       {"normalization_rule_name", "identity"},
       {"remove_extra_whitespaces", "false"},
       {"split_digits", "false"},
       {"max_sentence_length", std::to_string(kMaxTrainingLine)},
       {"input_sentence_size", "0"},
       {"shuffle_input_sentence", "false"},
       {"unk_id", "0"},
       {"eos_id", std::to_string(kEndOfLine)},
       {"bos_id", "-1"},
       {"pad_id", "-1"},
       {"num_threads", "2"},
       {"minloglevel", "2"}},
      &it, model);
}

// sentencepiece ends the whole process when one of its internal checks fails ("Program terminated
// with an unrecoverable error", exit status 255), which a corpus it was not written for can
// trip, so it trains in a process of its own (run_forked): such a failure is then an error
// naming the corpus, where divlab once ended without a word and left its trace's lock behind.
// Training takes seconds to minutes and cannot be stopped part-way: a stop request
// (common/signals.h) kills that process and ends this one as the signal would (nothing is
// cached or traced yet), so a run's cell does not outlive a sweep that was killed. Returns the
// model; throws InputError for what the corpus or the vocabulary cannot give.
std::string train_bpe_isolated(const Corpus& corpus, int vocab) {
  // What the child returns: "1" or "0" (trained or not), the status's length, a newline, the
  // status's text, then the model's bytes.
  const ForkedRun run = run_forked(
      [&] {
        std::string model;
        sentencepiece::util::Status status;
        train_bpe(corpus.lines, vocab, &model, &status);
        const std::string text = status.ToString();
        return (status.ok() ? "1" : "0") + std::to_string(text.size()) + "\n" + text + model;
      },
      stop_signal);
  if (run.stopped_by != 0) end_by_signal(run.stopped_by);
  if (run.killed_by != 0)  // the machine's doing (out of memory, say), not the corpus'
    throw std::runtime_error("tokenizer: the process training the BPE model was killed (" +
                             std::string(strsignal(run.killed_by)) + ")");
  const size_t newline = run.returned ? run.output.find('\n') : std::string::npos;
  if (newline == std::string::npos || newline < 2) {
    const std::string said = run.log.substr(0, run.log.find('\n'));
    throw InputError("data = '" + corpus.source +
                     "': the BPE tokenizer's trainer (sentencepiece) stopped on this corpus" +
                     (said.empty() ? "" : ": " + said));
  }
  const size_t status_size = std::stoul(run.output.substr(1, newline - 1));
  if (run.output[0] == '1') return run.output.substr(newline + 1 + status_size);
  // Every line past the trainer's limits leaves it nothing to learn from, which it reports as
  // an internal check ("!sentences_.empty()").
  if (std::all_of(corpus.lines.begin(), corpus.lines.end(), [](const std::string& l) {
        return l.size() > kMaxTrainingLine || has_overlong_word(l);
      }))
    throw InputError("data = '" + corpus.source + "': every line is longer than the " +
                     std::to_string(kMaxTrainingLine) +
                     " bytes the tokenizer trains on, or holds a word (characters between "
                     "two spaces) longer than its " +
                     std::to_string(kMaxTrainingWord) +
                     " characters (it learns from lines and words); break the text into "
                     "lines and words");
  const std::string msg = run.output.substr(newline + 1, status_size);
  // sentencepiece's own words for a vocabulary the corpus cannot fill: "... Vocabulary size too
  // high (64). Please set it to a value <= 5."
  const std::string bound = "Please set it to a value <= ";
  if (const size_t at = msg.find(bound); at != std::string::npos)
    throw InputError("data = '" + corpus.source + "': model.vocab = " + std::to_string(vocab) +
                     " is larger than this corpus supports (at most " +
                     std::to_string(std::atoll(msg.c_str() + at + bound.size())) + " BPE pieces)");
  throw InputError("data = '" + corpus.source + "': cannot train a BPE tokenizer with " +
                   "model.vocab = " + std::to_string(vocab) + ": " + msg);
}
}  // namespace

namespace {
std::string tokens_sha256(const std::vector<TokenId>& tokens) {
  return sha256_hex(
      std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(TokenId)));
}

// The cache entry at `stem` (.model, .tokens and the tokens' .sha256) into `out`, after the
// checks a damaged or hand-copied entry fails: a model sentencepiece loads at `vocab` pieces,
// whole ids each inside the vocabulary (an id past it indexed the embedding out of bounds: a
// crash, or a row of another tensor), and the tokens' recorded SHA-256 (a token file cut short
// at a whole id is another data set under the same name). "" when it is usable, else why not;
// nothing read (an entry not written yet) is "absent". An entry older than the .sha256 file
// passes on the other checks (`*unrecorded` set: its caller records the hash).
std::string read_cache_entry(const std::string& stem, int vocab, TokenizedCorpus* out,
                             bool* unrecorded) {
  std::string model, tb, sha;
  const bool model_found = read_file(stem + ".model", model);
  const bool tokens_found = read_file(stem + ".tokens", tb);
  const bool sha_found = read_file(stem + ".sha256", sha);
  if (!model_found || !tokens_found) return "absent";
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.LoadFromSerializedProto(model).ok()) return "its model is no sentencepiece model";
  if (sp.GetPieceSize() != vocab)
    return "its model has " + std::to_string(sp.GetPieceSize()) + " pieces, not " +
           std::to_string(vocab);
  if (tb.empty() || tb.size() % sizeof(TokenId) != 0)
    return "its token file holds " + std::to_string(tb.size()) + " bytes, no whole number of ids";
  std::vector<TokenId> tokens(tb.size() / sizeof(TokenId));
  std::memcpy(tokens.data(), tb.data(), tb.size());
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [vocab](TokenId id) { return id < 0 || id >= vocab; });
  if (bad != tokens.end())
    return "token " + std::to_string(bad - tokens.begin()) + " is id " + std::to_string(*bad) +
           ", outside 0.." + std::to_string(vocab - 1);
  const std::string hash = tokens_sha256(tokens);
  if (sha_found && sha.substr(0, 64) != hash)
    return "its tokens' SHA-256 is not the one recorded with them (cut short or changed?)";
  *unrecorded = !sha_found;
  out->model = std::move(model), out->tokens = std::move(tokens), out->tokens_sha256 = hash;
  return "";
}
}  // namespace

TokenizedCorpus tokenize_cached(const Corpus& corpus, int vocab, const std::string& cache,
                                bool verbose, const std::function<void(int64_t)>& accept) {
  const std::string key =
      sha256_hex(corpus.sha256 + "|" + std::to_string(vocab) + "|" + kTokenizerSettings);
  const std::string stem = cache + "/bpe-" + key.substr(0, 24);
  TokenizedCorpus out;
  bool unrecorded = false;
  if (const std::string why = read_cache_entry(stem, vocab, &out, &unrecorded); why.empty()) {
    out.from_cache = true;
    if (accept) accept(int64_t(out.tokens.size()));
    if (unrecorded) write_file_atomically(stem + ".sha256", out.tokens_sha256 + "\n");
    if (verbose)
      std::cerr << "tokenizer: reusing cached BPE model " << stem << ".model (" << out.tokens.size()
                << " tokens)\n";
    return out;
  } else if (why != "absent") {  // derived data: trained again and replaced
    std::cerr << "tokenizer: the cached tokenizer " << stem << ".* is damaged (" << why
              << "): training it again\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  out.model = train_bpe_isolated(corpus, vocab);
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.LoadFromSerializedProto(out.model).ok())
    throw std::runtime_error("tokenizer: sentencepiece produced an unreadable model");
  if (sp.GetPieceSize() != vocab)
    throw InputError("data = '" + corpus.source + "': model.vocab = " + std::to_string(vocab) +
                     " is larger than this corpus supports (BPE stopped at " +
                     std::to_string(sp.GetPieceSize()) + " pieces)");
  const double train_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::vector<int>> per_line(corpus.lines.size());
#pragma omp parallel for schedule(dynamic, 256)
  for (size_t i = 0; i < corpus.lines.size(); ++i) per_line[i] = sp.EncodeAsIds(corpus.lines[i]);
  for (const auto& ids : per_line) {
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    out.tokens.push_back(kEndOfLine);
  }
  if (accept) accept(int64_t(out.tokens.size()));
  // Sweep cells may train the same tokenizer at once: each writes its own file, then renames.
  // An unwritable cache only costs time later.
  make_dirs(cache);
  out.tokens_sha256 = tokens_sha256(out.tokens);
  const bool cached =
      write_file_atomically(stem + ".model", out.model) &&
      write_file_atomically(stem + ".tokens",
                            std::string(reinterpret_cast<const char*>(out.tokens.data()),
                                        out.tokens.size() * sizeof(TokenId))) &&
      write_file_atomically(stem + ".sha256", out.tokens_sha256 + "\n");
  if (verbose)
    std::cerr << "tokenizer: trained BPE model (vocab " << vocab << ") on " << corpus.lines.size()
              << " lines in " << train_s << " s; " << out.tokens.size() << " tokens; "
              << (cached ? "cached as " + stem + ".model"
                         : "not cached: '" + cache +
                               "' cannot be written (DIVLAB_CACHE moves "
                               "the cache)")
              << "\n";
  return out;
}

std::vector<int> bpe_encode(const std::string& model, const std::string& text) {
  sentencepiece::SentencePieceProcessor sp;
  sp.LoadFromSerializedProto(model);
  return sp.EncodeAsIds(text);
}
std::string bpe_decode(const std::string& model, const std::vector<int>& ids) {
  sentencepiece::SentencePieceProcessor sp;
  sp.LoadFromSerializedProto(model);
  return sp.DecodeIds(ids);
}

TextDataset::TextDataset(const std::string& spec, const Corpus& corpus, const DatasetOptions& opt)
    : seed_(opt.seed) {
  const int64_t need = opt.seq_len + 1;
  auto validation_size = [&](int64_t n) {
    return std::max<int64_t>(need, int64_t(double(n) * kValidationFraction));
  };
  auto accept = [&](int64_t n) {
    if (n - validation_size(n) < need)
      throw InputError("data = '" + spec + "': " + std::to_string(n) + " tokens are too few " +
                       "for model.seq_len = " + std::to_string(opt.seq_len) +
                       " (training and validation splits each need seq_len + 1)");
  };
  TokenizedCorpus tc = tokenize_cached(
      corpus, opt.vocab, opt.cache_dir.empty() ? cache_dir() : opt.cache_dir, opt.verbose, accept);
  tokens_ = std::move(tc.tokens);
  train_end_ = int64_t(tokens_.size()) - validation_size(int64_t(tokens_.size()));
  info_.spec = spec;
  info_.kind = "text";
  info_.vocab = opt.vocab;
  info_.corpus_sha256 = corpus.sha256;
  info_.corpus_tokens = train_end_;
  info_.tokenizer_model = std::move(tc.model);
  info_.tokens_sha256 = std::move(tc.tokens_sha256);
  info_.zipf_exponent = fit_zipf_exponent(unigram());
}

void TextDataset::windows(uint64_t stream, int64_t index, int64_t begin, int64_t end, int B, int T,
                          TokenId* in, TokenId* tgt) const {
  Rng rng(seed_, stream, uint64_t(index));
  const uint64_t starts = uint64_t(end - begin - T);  // windows of T + 1 tokens inside the split
  for (int b = 0; b < B; ++b) {
    const int64_t s = begin + int64_t(rng.below(starts));
    std::copy(tokens_.begin() + s, tokens_.begin() + s + T, in + int64_t(b) * T);
    std::copy(tokens_.begin() + s + 1, tokens_.begin() + s + T + 1, tgt + int64_t(b) * T);
  }
}

void TextDataset::batch(int64_t step, int B, int T, TokenId* in, TokenId* tgt) const {
  windows(kStreamData, step, 0, train_end_, B, T, in, tgt);
}
void TextDataset::validation_batch(int64_t index, int B, int T, TokenId* in, TokenId* tgt) const {
  windows(kStreamEvalData, index, train_end_, int64_t(tokens_.size()), B, T, in, tgt);
}

std::vector<double> TextDataset::unigram() const {
  std::vector<double> p(info_.vocab, 0.0);
  for (int64_t i = 0; i < train_end_; ++i) p[tokens_[i]] += 1.0;
  for (double& x : p) x /= double(train_end_);
  return p;
}

}  // namespace divlab
