#include "experiments/check.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/files.h"
#include "common/paths.h"
#include "common/process.h"
#include "datasets/dataset.h"
#include "experiments/config.h"
#include "experiments/reproduce.h"
#include "kernels/backend.h"
#include "kernels/harness.h"
#include "kernels/plugins.h"

namespace divlab {

namespace {

// The verdict's criteria, printed with every report.
constexpr double kTolerance = 1e-2;      // normalised error of every output: the verifier's scale
constexpr double kFp32Grade = 1e-4;      // every output within this: an fp32-grade kernel
constexpr double kBiasTolerance = 1e-3;  // |sum(|v| - |r|)| / sum|r|: systematic shrink or growth
constexpr size_t kBiasMinValues = 4096;  // fewer values: rounding noise alone reaches 1e-3
const char* kCriteria =
    "criteria: in every condition, every output within normalised error max|v - r| / max|r| <= "
    "1e-2 of the fp64 reference (every element counts: no 99 % exemption, so a hot embedding row "
    "cannot hide), finite where the reference is, no writes outside the outputs, and no "
    "systematic bias (|sum(|v| - |r|)| / sum|r| <= 1e-3 over >= 4096 values); grade fp32 if "
    "every output is within 1e-4. 'row err' (worst row's relative L2) is shown, not judged";

struct Shape {
  const char* name;
  int B, T, C, NH, V;
};
// 8192 tokens over 8192 ids: uniform rows get ~1 addition, Zipf(1.1)'s top row ~900, Brown's
// ("the") ~500, each position row 8: the dose at which bf16 accumulation breaks on hot rows and
// rounding alone does not. Used by the ops that gather or scatter by token id.
constexpr Shape kDose{"dose", 8, 1024, 64, 4, 8192};
constexpr Shape kTiny{"tiny", 1, 1, 4, 1, 5};
constexpr Shape kOdd{"odd", 3, 37, 72, 4, 301};  // multiples of neither 8, 32 nor 128
constexpr Shape kAligned{"aligned", 4, 64, 128, 4, 512};
constexpr Shape kLarge{"large", 8, 256, 256, 4, 2048};

enum class Values { Normal, Tiny, Large, ZeroRows };

struct Condition {
  std::string name;
  Shape shape;
  std::string tokens;  // uniform | zipf:1.1 | brown
  Values values = Values::Normal;
  bool repeat = false;
};

std::vector<Condition> conditions() {
  return {{"tokens uniform", kDose, "uniform"},
          {"tokens zipf:1.1", kDose, "zipf:1.1"},
          {"tokens text (Brown)", kDose, "brown"},
          {"shape tiny", kTiny, "uniform"},
          {"shape odd", kOdd, "uniform"},
          {"shape aligned", kAligned, "uniform"},
          {"shape large", kLarge, "uniform"},
          {"values tiny (x1e-10)", kAligned, "uniform", Values::Tiny},
          {"values large (x1e3)", kAligned, "uniform", Values::Large},
          {"values zero rows", kAligned, "uniform", Values::ZeroRows},
          {"repeat (bitwise)", kAligned, "uniform", Values::Normal, true}};
}

const std::vector<std::string>& checkable_ops() {
  static const std::vector<std::string> ops = {"embedding_forward",  "rmsnorm_forward",
                                               "rmsnorm_backward",   "linear_forward",
                                               "linear_backward",    "attention_forward",
                                               "attention_backward", "gelu_forward",
                                               "gelu_backward",      "add",
                                               "cross_entropy",      "embed_rmsnorm_backward"};
  return ops;
}

std::vector<TokenId> make_tokens(const std::string& kind, const Shape& s, std::mt19937_64& gen,
                                 uint64_t seed, std::string* note) {
  const int N = s.B * s.T;
  std::vector<TokenId> ids(N), targets(N);
  if (kind == "uniform") {
    for (auto& t : ids) t = TokenId(gen() % s.V);
    return ids;
  }
  DatasetOptions o;
  o.vocab = s.V, o.seq_len = s.T, o.seed = seed;
  try {
    make_dataset(kind, o)->batch(0, s.B, s.T, ids.data(), targets.data());
  } catch (const InputError& e) {
    *note = e.what();
    return {};
  }
  return ids;
}

// The op's inputs under a condition. `act` inputs are scaled by the value condition (and get
// zero rows); weights keep their scale; rstd and attention probabilities are derived from the
// inputs (in fp64) so the backward ops see a consistent forward.
struct Case {
  OpInputs x;
  std::vector<int64_t> cols;  // row length of every output
  // How many leading outputs are judged: the rest are saved state in a kernel's own format (the
  // fused attention forward saves no probabilities), checked through the op that reads them.
  size_t judged = SIZE_MAX;
};

std::vector<double> normal(size_t n, std::mt19937_64& gen, double mean = 0.0) {
  std::normal_distribution<double> d(mean, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

void apply_values(std::vector<double>& v, int64_t row, Values values) {
  const double scale = values == Values::Tiny ? 1e-10 : values == Values::Large ? 1e3 : 1.0;
  for (auto& x : v) x *= scale;
  if (values == Values::ZeroRows)
    for (int64_t i = 0; i < std::min<int64_t>(int64_t(v.size()), 3 * row); ++i) v[i] = 0;
}

std::vector<double> rstd_of(const std::vector<double>& x, int N, int C, double eps) {
  std::vector<double> r(N);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[size_t(n) * C + c] * x[size_t(n) * C + c];
    r[n] = 1.0 / std::sqrt(ss / C + eps);
  }
  return r;
}

constexpr double kEps = 1e-5;

template <class KS>
OpRun call_op(const std::string& op, const KS& k, const OpInputs& x, const Shape& s);

Case build(const std::string& op, const Shape& s, const std::vector<TokenId>& tokens, Values values,
           std::mt19937_64& gen) {
  const int B = s.B, T = s.T, C = s.C, V = s.V, NH = s.NH, N = B * T;
  const size_t NC = size_t(N) * C;
  auto act = [&](size_t n, int64_t row) {
    auto v = normal(n, gen);
    apply_values(v, row, values);
    return v;
  };
  auto zeros = [](size_t n) { return std::vector<double>(n, 0.0); };
  Case c;
  c.x.ids = tokens;
  if (op == "embedding_forward") {
    c.x.values = {normal(size_t(V) * C, gen), normal(size_t(T) * C, gen)};
    c.x.outputs = {zeros(NC)}, c.cols = {C};
  } else if (op == "rmsnorm_forward") {
    c.x.values = {act(NC, C), normal(C, gen, 1.0)};
    c.x.outputs = {zeros(NC), zeros(N)}, c.cols = {C, 1};
  } else if (op == "rmsnorm_backward") {
    auto xs = act(NC, C);
    c.x.values = {act(NC, C), xs, normal(C, gen, 1.0), rstd_of(xs, N, C, kEps)};
    c.x.outputs = {normal(NC, gen), normal(C, gen)}, c.cols = {C, C};
  } else if (op == "linear_forward") {
    c.x.values = {act(NC, C), normal(size_t(V) * C, gen)};
    c.x.outputs = {zeros(size_t(N) * V)}, c.cols = {V};
  } else if (op == "linear_backward") {
    c.x.values = {act(size_t(N) * V, V), act(NC, C), normal(size_t(V) * C, gen)};
    c.x.outputs = {zeros(NC), normal(size_t(V) * C, gen)}, c.cols = {C, C};
  } else if (op == "attention_forward") {
    c.x.values = {act(3 * NC, 3 * C)};
    c.x.outputs = {zeros(NC), zeros(size_t(B) * NH * T * T)}, c.cols = {C, T};
    c.judged = 1;  // out; att is the backward's saved state (not written by the fused kernel)
  } else if (op == "attention_backward") {
    const auto qkv = act(3 * NC, 3 * C);
    Case fwd = build("attention_forward", s, tokens, Values::Normal, gen);
    fwd.x.values = {qkv};
    const OpRun ref = call_op("attention_forward", cpu_catalogue<double>().select({}), fwd.x, s);
    c.x.values = {act(NC, C), qkv, ref.outputs[1]};
    c.x.outputs = {zeros(3 * NC)}, c.cols = {3 * C};
  } else if (op == "gelu_forward") {
    c.x.values = {act(NC, C)};
    c.x.outputs = {zeros(NC)}, c.cols = {C};
  } else if (op == "gelu_backward" || op == "add") {  // two [N, C] inputs, one [N, C] output
    c.x.values = {act(NC, C), act(NC, C)};
    c.x.outputs = {zeros(NC)}, c.cols = {C};
  } else if (op == "cross_entropy") {
    c.x.values = {act(size_t(N) * V, V)};
    c.x.outputs = {zeros(N), zeros(size_t(N) * V)}, c.cols = {1, V};
  } else if (op == "embed_rmsnorm_backward") {
    // Gradients with a per-channel mean shared by every row, as a step's gradients of one token's
    // occurrences tend to share a direction: a hot row's contributions add up coherently.
    const std::vector<double> mean = normal(C, gen);
    auto grad = [&] {
      std::vector<double> g = normal(NC, gen);
      for (size_t i = 0; i < NC; ++i) g[i] += mean[i % C];
      apply_values(g, C, values);
      return g;
    };
    auto x0 = act(NC, C);
    c.x.values = {grad(), grad(), x0, normal(C, gen, 1.0), rstd_of(x0, N, C, kEps)};
    // Zeroed, as in training: this op is the only writer of these gradients.
    c.x.outputs = {zeros(size_t(V) * C), zeros(size_t(T) * C), zeros(C)};
    c.cols = {C, C, C};
  }
  return c;
}

template <class KS>
OpRun call_op(const std::string& op, const KS& k, const OpInputs& x, const Shape& s) {
  using U = typename KS::Value;
  const int B = s.B, T = s.T, C = s.C, V = s.V, NH = s.NH, N = B * T;
  const int64_t NC = int64_t(N) * C;
  OpContextSource contexts(*k.memory);
  const OpContext ctx = contexts.next();
  return run_op(k, x, [&](const KS& kk, auto& in, const TokenId* ids, auto& out) {
    if (op == "embedding_forward") kk.embedding_forward(ctx, out[0], ids, in[0], in[1], B, T, C);
    if (op == "rmsnorm_forward")
      kk.rmsnorm_forward(ctx, out[0], out[1], in[0], in[1], N, C, U(kEps));
    if (op == "rmsnorm_backward")
      kk.rmsnorm_backward(ctx, out[0], out[1], in[0], in[1], in[2], in[3], N, C);
    if (op == "linear_forward") kk.linear_forward(ctx, out[0], in[0], in[1], N, C, V);
    if (op == "linear_backward")
      kk.linear_backward(ctx, out[0], out[1], in[0], in[1], in[2], N, C, V);
    if (op == "attention_forward") kk.attention_forward(ctx, out[0], out[1], in[0], B, T, C, NH);
    if (op == "attention_backward")
      kk.attention_backward(ctx, out[0], in[0], in[1], in[2], B, T, C, NH);
    if (op == "gelu_forward") kk.gelu_forward(ctx, out[0], in[0], NC);
    if (op == "gelu_backward") kk.gelu_backward(ctx, out[0], in[0], in[1], NC);
    if (op == "add") kk.add(ctx, out[0], in[0], in[1], NC);
    if (op == "cross_entropy") kk.cross_entropy(ctx, out[0], out[1], in[0], ids, N, V, U(1.0 / N));
    if (op == "embed_rmsnorm_backward")
      kk.embed_rmsnorm_backward(ctx, out[0], out[1], out[2], in[0], in[1], in[2], in[3], in[4], ids,
                                B, T, C, V);
  });
}

void measure(ConditionResult& r, const OpRun& got, const OpRun& ref,
             const std::vector<int64_t>& cols, size_t judged) {
  double abs_v = 0, abs_r = 0;
  size_t pass = 0, total = 0;
  for (size_t o = 0; o < std::min(judged, ref.outputs.size()); ++o) {
    const auto &v = got.outputs[o], &b = ref.outputs[o];
    const int64_t n = int64_t(b.size()), w = cols[o];
    double max_ref = 0, max_diff = 0;
    for (int64_t row = 0; row * w < n; ++row) {
      double d2 = 0, r2 = 0;
      for (int64_t i = row * w; i < std::min(n, (row + 1) * w); ++i) {
        const double d = v[i] - b[i];
        if (std::isfinite(b[i]) && !std::isfinite(v[i])) r.finite = false;
        d2 += d * d, r2 += b[i] * b[i];
        max_ref = std::max(max_ref, std::abs(b[i]));
        max_diff = std::max(max_diff, std::abs(d));
        pass += std::abs(d) <= 1e-2 + 1e-2 * std::abs(b[i]);
        ++total;
        abs_v += std::abs(v[i]), abs_r += std::abs(b[i]);
      }
      const double rel = r2 > 0 ? std::sqrt(d2 / r2) : (d2 > 0 ? INFINITY : 0.0);
      if (!(rel <= r.row_error))
        r.row_error = std::isnan(rel) ? INFINITY : std::max(r.row_error, rel);
    }
    const double norm = max_ref > 0 ? max_diff / max_ref : max_diff;
    r.norm_error = std::isnan(norm) ? INFINITY : std::max(r.norm_error, norm);
  }
  r.verifier_pass = total ? double(pass) / double(total) : 1.0;
  r.bias = abs_r > 0 && total >= kBiasMinValues ? (abs_v - abs_r) / abs_r : 0.0;
  if (!std::isfinite(r.bias)) r.bias = 0;  // non-finite outputs are reported as such
}

std::string fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", x);
  return b;
}

}  // namespace

CheckReport run_check(const CheckOptions& opt) {
  const auto eq = opt.target.find('=');
  if (eq == std::string::npos)
    throw InputError("check '" + opt.target +
                     "': expected OP=VARIANT, e.g. "
                     "embed_rmsnorm_backward=bf16_accum");
  CheckReport rep;
  rep.op = opt.target.substr(0, eq), rep.variant = opt.target.substr(eq + 1);
  rep.backend = name_of(opt.backend);
  const auto& ops = checkable_ops();
  if (std::find(ops.begin(), ops.end(), rep.op) == ops.end()) {
    std::string list;
    for (const auto& o : ops) list += (list.empty() ? "" : ", ") + o;
    throw InputError("check '" + opt.target + "': op '" + rep.op + "' is not checkable; " + list);
  }
  try {
    load_plugins(opt.plugins);
  } catch (const PluginError& e) {
    throw InputError(std::string("--plugins: ") + e.what());
  }
  KernelSet<float> variant;
  try {
    open_backend(opt.backend);
    variant =
        backend_catalogue<float>(opt.backend, Precision::Fp32).select({{rep.op, rep.variant}});
  } catch (const BackendError& e) {
    throw InputError(e.what());
  } catch (const UnknownKernel& e) {
    throw InputError(std::string("check: ") + e.what());
  }
  const KernelSet<double> reference = cpu_catalogue<double>().select({});
  const uint64_t seed = opt.seed ? opt.seed : std::random_device{}();
  rep.seed = seed;
  std::mt19937_64 gen(seed);
  double worst_row = 0;
  for (const Condition& cond : conditions()) {
    ConditionResult r;
    r.name = cond.name;
    const Shape& s = cond.shape;
    r.shape = "B" + std::to_string(s.B) + " T" + std::to_string(s.T) + " C" + std::to_string(s.C) +
              " V" + std::to_string(s.V);
    const bool by_token = rep.op == "embedding_forward" || rep.op == "embed_rmsnorm_backward";
    if (cond.shape.name == std::string("dose") && !by_token) {
      r.ran = false, r.note = "the op does not gather or scatter by token id";
      rep.conditions.push_back(r);
      continue;
    }
    const std::vector<TokenId> tokens = make_tokens(cond.tokens, s, gen, seed, &r.note);
    if (tokens.empty()) {
      r.ran = false;
      rep.conditions.push_back(r);
      continue;
    }
    const Case c = build(rep.op, s, tokens, cond.values, gen);
    const OpRun ref = call_op(rep.op, reference, c.x, s);
    OpRun got;
    try {
      got = call_op(rep.op, variant, c.x, s);
    } catch (const std::exception& e) {  // a verdict under this condition, not an internal error
      r.failed = true, r.finite = false, r.why = std::string("the kernel threw: ") + e.what();
      rep.pass = false, rep.verifier_passes_all = false, rep.failing.push_back(r.name);
      rep.conditions.push_back(r);
      continue;
    }
    measure(r, got, ref, c.cols, c.judged);
    r.stray_writes = got.stray_writes;
    if (cond.repeat) {
      OpRun again;
      try {
        again = call_op(rep.op, variant, c.x, s);
      } catch (const std::exception& e) {
        again.outputs.clear();
        r.note = std::string("threw on the repeat: ") + e.what();
      }
      // Bit patterns, not values: NaN != NaN would call a NaN-producing kernel unrepeatable
      // (its NaNs are reported as non-finite output instead).
      for (size_t o = 0; o < got.outputs.size(); ++o)
        r.deterministic = r.deterministic && o < again.outputs.size() &&
                          got.outputs[o].size() == again.outputs[o].size() &&
                          std::memcmp(got.outputs[o].data(), again.outputs[o].data(),
                                      got.outputs[o].size() * sizeof(double)) == 0;
      if (!r.deterministic && r.note.empty()) r.note = "not bitwise repeatable";
    }
    if (!r.stray_writes.empty())
      r.failed = true, r.why = "writes outside its output (" + r.stray_writes[0] + ")";
    else if (!r.finite)
      r.failed = true, r.why = "non-finite output where the reference is finite";
    else if (r.norm_error > kTolerance)
      r.failed = true, r.why = "error " + fmt(r.norm_error) + " > 1e-2";
    else if (std::abs(r.bias) > kBiasTolerance)
      r.failed = true, r.why = std::string("biased: outputs ") + (r.bias < 0 ? "shrink" : "grow") +
                               " by " + fmt(std::abs(r.bias));
    if (r.failed) rep.pass = false, rep.failing.push_back(r.name);
    if (r.verifier_pass < 0.99 || !r.finite) rep.verifier_passes_all = false;
    worst_row = std::max(worst_row, r.norm_error);
    rep.conditions.push_back(r);
  }
  rep.grade = worst_row <= kFp32Grade ? "fp32" : "bf16";
  return rep;
}

std::string format_check(const CheckReport& r) {
  std::ostringstream o;
  char line[512];
  o << "divlab check " << r.op << "=" << r.variant << " (" << r.backend << ", seed " << r.seed
    << "): every condition against the op's reference in fp64\n";
  std::snprintf(line, sizeof line, "%-22s %-20s %10s %10s %9s %10s  %s\n", "condition", "shape",
                "error", "row err", "verifier", "bias", "result");
  o << line;
  for (const auto& c : r.conditions) {
    if (!c.ran) {
      std::snprintf(line, sizeof line, "%-22s %-20s %10s %10s %9s %10s  skipped: %s\n",
                    c.name.c_str(), c.shape.c_str(), "-", "-", "-", "-", c.note.c_str());
      o << line;
      continue;
    }
    const std::string result = c.failed                    ? "FAIL: " + c.why
                               : c.norm_error > kFp32Grade ? "ok (bf16-grade)"
                                                           : "ok";
    std::snprintf(line, sizeof line, "%-22s %-20s %10s %10s %9s %+10.2e  %s%s\n", c.name.c_str(),
                  c.shape.c_str(), fmt(c.norm_error).c_str(), fmt(c.row_error).c_str(),
                  c.verifier_pass >= 0.99 && c.finite ? "pass" : "FAIL", c.bias, result.c_str(),
                  c.note.empty() ? "" : ("; " + c.note).c_str());
    o << line;
  }
  o << "\n";
  if (r.pass) {
    o << "verdict: PASS (" << r.grade << "-grade";
    if (r.grade == "bf16") o << ": within 1e-2 but not 1e-4; not an fp32-exact kernel";
    o << ")\n";
  } else {
    o << "verdict: FAIL under:";
    for (const auto& f : r.failing) o << " [" << f << "]";
    o << "\n";
    if (r.verifier_passes_all)
      o << "note: the benchmark verifier (|v - r| <= 1e-2 + 1e-2 |r| for 99 % of elements) "
           "passes every condition; it would have accepted this kernel.\n";
  }
  if (!r.sanitizer.empty()) o << "compute-sanitizer memcheck: " << r.sanitizer << "\n";
  o << kCriteria << "\n";
  return o.str();
}

namespace {
// Runs the same check (same seed) under compute-sanitizer memcheck; returns its summary.
std::string sanitizer_pass(const CheckOptions& opt, uint64_t seed) {
  if (!on_path("compute-sanitizer")) return "not run (compute-sanitizer not on PATH)";
  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return "not run (no /proc/self/exe)";
  std::vector<std::string> argv = {"compute-sanitizer",
                                   "--tool",
                                   "memcheck",
                                   "--error-exitcode",
                                   "99",
                                   self,
                                   "check",
                                   opt.target,
                                   "--backend",
                                   "cuda",
                                   "--no-sanitizer",
                                   "--seed",
                                   std::to_string(seed)};
  for (const auto& p : opt.plugins) argv.insert(argv.end(), {"--plugins", p});
  SpawnOptions so;
  so.log = "/tmp/divlab-check-sanitizer-" + std::to_string(getpid()) + ".log";
  const std::string& log = so.log;
  const int rc = run_process(argv, so);
  std::ifstream in(log);
  std::string line, summary = "no summary";
  while (std::getline(in, line))
    if (line.find("ERROR SUMMARY") != std::string::npos) summary = line.substr(line.find("ERROR"));
  std::remove(log.c_str());
  return (WIFEXITED(rc) && WEXITSTATUS(rc) == 99 ? "ERRORS: " : "") + summary;
}
}  // namespace

namespace {
// --train's settings, checked before anything runs: a bad one must not cost the user the whole
// stress table first, nor leave a grid file behind.
std::string train_output(const CheckOptions& opt, const std::string& op,
                         const std::string& variant) {
  if (!opt.train) {
    if (!opt.out.empty()) throw InputError("check --out '" + opt.out + "': only used with --train");
    if (opt.jobs != 0)
      throw InputError("check --jobs " + std::to_string(opt.jobs) + ": only used with --train");
    return "";
  }
  if (opt.jobs < 0) throw InputError("check --jobs " + std::to_string(opt.jobs) + ": must be >= 0");
  std::string out = opt.out.empty() ? "runs/check-" + op + "-" + variant : opt.out;
  const auto slash = out.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : out.substr(0, slash + 1);
  if (access(parent.c_str(), W_OK) != 0)
    throw InputError("check --out '" + out + "': folder '" + parent +
                     "' does not exist or is not writable");
  return out;
}
}  // namespace

int cmd_check(const CheckOptions& opt) {
  const auto eq = opt.target.find('=');
  const std::string train_out =
      eq == std::string::npos
          ? ""
          : train_output(opt, opt.target.substr(0, eq), opt.target.substr(eq + 1));
  CheckReport r = run_check(opt);
  if (opt.backend == Backend::Cuda && opt.sanitizer) {
    r.sanitizer = sanitizer_pass(opt, r.seed);
    if (r.sanitizer.rfind("ERRORS", 0) == 0) r.pass = false, r.failing.push_back("sanitizer");
  }
  std::fputs(format_check(r).c_str(), stdout);
  if (opt.train) {
    // The short reproduce grid (Markov chains with and without hot ids, where the reported
    // kernel diverges under SGD and AdamW hides it) with this candidate and the op's benign
    // controls in place of the reported kernel, on the check's backend.
    const std::string base = resource_path("configs/reproduce.toml");
    std::ifstream in(base);
    std::string text, l;
    bool skipping = false;
    while (std::getline(in, l)) {
      if (!l.empty() && l[0] == '[') skipping = l == "[axes.kernels]";
      if (!skipping) text += l + "\n";
      if (l != "[set]") continue;
      text += std::string("backend = \"") + name_of(opt.backend) + "\"\n";
      if (!opt.plugins.empty()) {
        text += "plugins = [";
        for (size_t i = 0; i < opt.plugins.size(); ++i)
          text += (i ? ", \"" : "\"") + opt.plugins[i] + "\"";
        text += "]\n";
      }
    }
    // The reference once, even when it is the kernel being checked.
    std::string arms =
        "\"reference\"" + (r.variant == "reference" ? "" : ", \"" + r.variant + "\"");
    backend_catalogue<float>(opt.backend, Precision::Fp32).for_each_op([&](const auto& ops, auto) {
      if (ops.op != r.op) return;
      for (const auto& e : ops.entries)
        if (e.doc.benign && e.name != r.variant) arms += ", \"" + e.name + "\"";
    });
    text += "\n[axes.kernels]\n" + r.op + " = [" + arms + "]\n";
    ReproduceOptions rp;
    rp.out = train_out;
    rp.quick = true, rp.jobs = opt.jobs, rp.plots = opt.plots;
    rp.grid = rp.out + ".grid.toml";
    if (!write_file_atomically(rp.grid, text))
      throw InputError("check --out '" + rp.out + "': cannot write '" + rp.grid + "'");
    std::printf("\n--train: the short reproduce grid with %s=%s (%s)\n", r.op.c_str(),
                r.variant.c_str(), rp.grid.c_str());
    run_reproduce(rp);
  }
  // What to do next, by outcome.
  const std::string candidate = r.op + "=" + r.variant;
  if (!r.pass)
    std::printf(
        "\nnext: the failing conditions above name what breaks it; `divlab kernels --op %s` "
        "lists how the zoo's variants fail, for comparison\n",
        r.op.c_str());
  else if (!opt.train)
    std::printf(
        "\nnext: `divlab check %s --train` trains with it (the short reproduce grid) to "
        "see what it does to a loss curve\n",
        candidate.c_str());
  else
    std::printf(
        "\nnext: the verdicts above are against the op's benign controls; `divlab bisect` "
        "finds which of several swapped kernels moves the loss\n");
  return r.pass ? 0 : 1;
}

}  // namespace divlab
