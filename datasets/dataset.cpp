#include "datasets/dataset.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "common/errors.h"
#include "datasets/synthetic.h"
#include "datasets/text.h"

namespace divlab {

namespace {
// A number inside a data spec, e.g. the S of zipf:S; throws naming the spec and the part.
double spec_number(const std::string& spec, const std::string& s, const char* what) {
  try {
    size_t used = 0;
    const double x = std::stod(s, &used);
    if (used == s.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  throw InputError("data = '" + spec + "': the " + what + " '" + s + "' is not a number");
}
}  // namespace

DatasetSpec parse_dataset_spec(const std::string& spec) {
  DatasetSpec s;
  using Kind = DatasetSpec::Kind;
  if (spec == "uniform") return s;
  if (spec == "brown") return s.kind = Kind::Brown, s;
  if (spec == "english") return s.kind = Kind::English, s;
  if (spec.rfind("text:", 0) == 0) return s.kind = Kind::Text, s.path = spec.substr(5), s;
  if (spec.rfind("zipf:", 0) == 0) {
    s.kind = Kind::Zipf, s.exponent = spec_number(spec, spec.substr(5), "Zipf exponent");
    if (!(s.exponent > 0)) throw InputError("data = '" + spec + "': the Zipf exponent must be > 0");
    return s;
  }
  if (spec.rfind("markov:", 0) == 0) {
    const std::string args = spec.substr(7);
    const size_t comma = args.find(',');
    if (comma == std::string::npos)
      throw InputError("data = '" + spec + "': expected markov:S,P (Zipf exponent S >= 0, " +
                       "0 for uniform; successor probability 0 < P < 1)");
    s.kind = Kind::Markov;
    s.exponent = spec_number(spec, args.substr(0, comma), "Zipf exponent");
    s.follow = spec_number(spec, args.substr(comma + 1), "successor probability");
    if (!(s.exponent >= 0))
      throw InputError("data = '" + spec + "': the Zipf exponent must be >= 0");
    if (!(s.follow > 0 && s.follow < 1))
      throw InputError("data = '" + spec + "': the successor probability must be in (0, 1)");
    return s;
  }
  throw InputError("data = '" + spec + "': unknown dataset kind; valid: uniform, zipf:S, " +
                   "markov:S,P, text:PATH, brown, english");
}

void check_dataset_source(const std::string& spec) {
  const DatasetSpec s = parse_dataset_spec(spec);
  if (s.kind == DatasetSpec::Kind::Text) check_text_source(s.path);
  if (s.kind == DatasetSpec::Kind::Brown) check_brown_source(data_dir() + "/brown");
  if (s.kind == DatasetSpec::Kind::English) check_english_source(data_dir());
}

std::string text_read_whole(const std::string& spec) {
  if (spec.rfind("text:", 0) == 0) return spec.substr(5);
  if (spec == "english") return english_folder(data_dir());
  return "";
}

std::unique_ptr<Dataset> make_dataset(const std::string& spec, const DatasetOptions& opt) {
  const DatasetSpec s = parse_dataset_spec(spec);
  switch (s.kind) {
    case DatasetSpec::Kind::Uniform:
      return std::make_unique<SyntheticDataset>(spec, opt.vocab, opt.seed, 0.0);
    case DatasetSpec::Kind::Zipf:
      return std::make_unique<SyntheticDataset>(spec, opt.vocab, opt.seed, s.exponent);
    case DatasetSpec::Kind::Markov:
      return std::make_unique<SyntheticDataset>(spec, opt.vocab, opt.seed, s.exponent, s.follow);
    case DatasetSpec::Kind::Text:
      return std::make_unique<TextDataset>(spec, read_text_corpus(s.path), opt);
    case DatasetSpec::Kind::Brown:
      return std::make_unique<TextDataset>(spec, read_brown_corpus(data_dir() + "/brown"), opt);
    case DatasetSpec::Kind::English:
      return std::make_unique<TextDataset>(spec, read_english_corpus(data_dir()), opt);
  }
  throw std::logic_error("make_dataset: a DatasetSpec kind without a dataset");
}

double fit_zipf_exponent(std::vector<double> p) {
  std::sort(p.begin(), p.end(), std::greater<>());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (size_t r = 0; r < p.size() && p[r] > 0; ++r, ++n) {
    const double x = std::log(double(r + 1)), y = std::log(p[r]);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  if (n < 2) return 0.0;
  const double denom = n * sxx - sx * sx;
  return denom > 0 ? -(n * sxy - sx * sy) / denom : 0.0;
}

DatasetSummary summarize(const Dataset& data, int B, int T, int batches, int ranks) {
  DatasetSummary s;
  std::vector<double> p = data.unigram();
  std::sort(p.begin(), p.end(), std::greater<>());
  s.top1_share = p.empty() ? 0 : p[0];
  for (size_t i = 0; i < p.size() && i < 10; ++i) s.top10_share += p[i];
  s.zipf_exponent = data.info().zipf_exponent;
  s.tokens = data.info().kind == "text" ? data.info().corpus_tokens : -1;
  std::vector<TokenId> in(int64_t(B) * T), tgt(in.size());
  const int vocab = data.info().vocab;
  double total = 0, per_rank = 0;
  for (int b = 0; b < batches; ++b) {
    data.batch(b, B, T, in.data(), tgt.data());
    total +=
        double(batch_stats(in.data(), int64_t(in.size()), vocab, nullptr).max_row_contributions);
    per_rank += double(largest_shard_contributions(in.data(), B, T, ranks, vocab));
  }
  s.expected_max_row_contributions = total / batches;
  s.expected_max_row_contributions_per_rank = per_rank / batches;
  s.batches_sampled = batches;
  return s;
}

}  // namespace divlab
