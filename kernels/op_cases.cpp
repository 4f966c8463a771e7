#include "kernels/op_cases.h"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>
#include <tuple>
#include <type_traits>

#include "kernels/invoke_op.h"
#include "kernels/op_context.h"
#include "kernels/plugin_calls.h"

namespace divlab {

namespace {

constexpr double kEps = 1e-5;  // the rstd inputs' (the scalars' default eps)
constexpr double kOutlierScale = 30;

bool is_prime(int n) {
  if (n < 2) return false;
  for (int d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// A size in [lo, hi], biased toward the ones tuned kernels get wrong.
int awkward(std::mt19937_64& gen, int lo, int hi) {
  auto in = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(gen); };
  switch (in(0, 4)) {
    case 0:  // the smallest
      return lo;
    case 1: {  // a prime
      for (int tries = 0; tries < 64; ++tries) {
        const int p = in(lo, hi);
        if (is_prime(p)) return p;
      }
      return in(lo, hi);
    }
    case 2: {  // one past or short of a power of two
      std::vector<int> near;
      for (int p = 2; p <= 2 * hi; p *= 2)
        for (int v : {p - 1, p + 1})
          if (v >= lo && v <= hi) near.push_back(v);
      if (!near.empty()) return near[size_t(in(0, int(near.size()) - 1))];
      return in(lo, hi);
    }
    default:
      return in(lo, hi);
  }
}

std::vector<double> normal(size_t n, std::mt19937_64& gen, double mean = 0.0) {
  std::normal_distribution<double> d(mean, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Each row of `row` values times its own 10^u, u uniform in [-3, 3] (Values::RowScales).
void scale_rows(std::vector<double>& v, int64_t row, std::mt19937_64& gen) {
  for (size_t i = 0; i < v.size(); i += size_t(row)) {
    const double scale = std::pow(10.0, std::uniform_real_distribution<double>(-3, 3)(gen));
    for (size_t k = i; k < std::min(v.size(), i + size_t(row)); ++k) v[k] *= scale;
  }
}

// An activation of `n` values in rows of `row`, under the value condition.
std::vector<double> activation(size_t n, int64_t row, Values values, std::mt19937_64& gen) {
  std::vector<double> v = normal(n, gen);
  const double scale = values == Values::Tiny ? 1e-10 : values == Values::Large ? 1e3 : 1.0;
  for (auto& x : v) x *= scale;
  if (values == Values::NaNs)
    for (int k = 0; k < 2 && !v.empty(); ++k) v[size_t(gen() % v.size())] = std::nan("");
  if (values == Values::ZeroRows)
    std::fill(v.begin(), v.begin() + std::min<int64_t>(int64_t(v.size()), 3 * row), 0.0);
  if (values == Values::Shifted && row > 0)
    for (size_t i = 0; i < v.size(); i += size_t(row)) {
      const double by = std::uniform_real_distribution<double>(1e2, 1e3)(gen);
      const double shift = gen() % 2 ? by : -by;
      for (size_t k = i; k < std::min(v.size(), i + size_t(row)); ++k) v[k] += shift;
    }
  if (values == Values::RowScales && row > 0) scale_rows(v, row, gen);
  if (values == Values::Outliers && row > 0) {
    // One channel in 32 (at least one), the same in every row: LLM activations' outlier
    // features, or the few ids a trained head gives high logits.
    std::vector<int64_t> channels;
    for (int64_t c = 0; c < row; ++c)
      if (gen() % 32 == 0) channels.push_back(c);
    if (channels.empty()) channels.push_back(int64_t(gen() % uint64_t(row)));
    for (size_t i = 0; i < v.size(); i += size_t(row))
      for (int64_t c : channels)
        if (i + size_t(c) < v.size()) v[i + size_t(c)] *= kOutlierScale;
  }
  return v;
}

std::vector<double> rstd_of(const std::vector<double>& x, int64_t N, int64_t C) {
  std::vector<double> r(size_t(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[size_t(n * C + c)] * x[size_t(n * C + c)];
    r[size_t(n)] = 1.0 / std::sqrt(ss / double(C) + kEps);
  }
  return r;
}

}  // namespace

std::string OpShape::text() const {
  return "B" + std::to_string(B) + " T" + std::to_string(T) + " C" + std::to_string(C) + " NH" +
         std::to_string(NH) + " V" + std::to_string(V);
}

int OpShape::NKV() const {
  if (kv_heads > 0) return kv_heads;
  int p = 2;
  while (p < NH && NH % p != 0) ++p;
  return NH <= 1 ? 1 : NH / p;
}

const std::vector<Op>& ops_on_packed_tensors() {
  static const std::vector<Op> ops = {Op::embedding_forward,
                                      Op::rmsnorm_forward,
                                      Op::rmsnorm_backward,
                                      Op::linear_forward,
                                      Op::linear_backward,
                                      Op::add_rmsnorm_forward,
                                      Op::embed_rmsnorm_backward,
                                      Op::cast,
                                      Op::sum_squares,
                                      Op::sgd_step,
                                      Op::adamw_step,
                                      Op::grad_reduce};
  return ops;
}

OpShape random_shape(std::mt19937_64& gen) {
  OpShape s;
  s.NH = std::vector<int>{1, 2, 3, 4, 6}[size_t(gen() % 5)];
  // At least two channels: a norm over one is degenerate (its gradient is the cancellation
  // 1 - x^2 / (x^2 + eps), which no fp32 kernel computes to the fp32 grade).
  s.C = s.NH * awkward(gen, s.NH == 1 ? 2 : 1, 40);
  s.B = awkward(gen, 1, 4);
  s.T = awkward(gen, 1, std::min(300, 600 / s.B));
  s.V = awkward(gen, 2, 700);
  return s;
}

std::vector<OpShape> smaller_shapes(const OpShape& s) {
  std::vector<OpShape> out;
  auto add = [&](OpShape t) {
    if (t.B >= 1 && t.T >= 1 && t.NH >= 1 && t.C >= std::max(2, t.NH) && t.C % t.NH == 0 &&
        t.V >= 2)
      out.push_back(t);
  };
  // Each dimension to 1, to about half (both sides: a failure may need an odd size), and one
  // less: enough steps that a failure tied to a residue (N mod 8) still finds a small size.
  auto steps = [](int d, int lo) {
    std::vector<int> v;
    for (int x : {lo, d / 2, d / 2 + 1, d - 1})
      if (x >= lo && x < d && std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
    return v;
  };
  const int hd = s.C / s.NH;
  for (int b : steps(s.B, 1)) add({b, s.T, s.C, s.NH, s.V});
  for (int t : steps(s.T, 1)) add({s.B, t, s.C, s.NH, s.V});
  for (int h : steps(hd, 1)) add({s.B, s.T, s.NH * h, s.NH, s.V});
  if (s.NH > 1) add({s.B, s.T, hd, 1, s.V});
  for (int v : steps(s.V, 2)) add({s.B, s.T, s.C, s.NH, v});
  return out;
}

std::vector<TokenId> uniform_tokens(const OpShape& s, std::mt19937_64& gen) {
  std::vector<TokenId> ids(size_t(s.tokens()));
  for (auto& t : ids) t = TokenId(gen() % uint64_t(s.V));
  return ids;
}

void round_to_bf16(std::vector<double>& v) {
  for (auto& x : v) x = double(lowp::bf16_rne(float(x)));
}

void round_to_fp32(std::vector<double>& v) {
  for (double& x : v) x = double(float(x));
}

// Every op of kernels/op_list.h has a case in the three switches below; a new op without one is a
// -Wswitch warning (an error under DIVLAB_WERROR) here, not a silent gap in check and the tests.
static_assert(kOpCount == 26, "an op was added: give it its inputs and its call below");

OpInputs op_inputs(const std::string& op, const OpShape& s, const std::vector<TokenId>& ids,
                   Values values, std::mt19937_64& gen) {
  const int64_t B = s.B, T = s.T, C = s.C, V = s.V, NH = s.NH, N = B * T;
  const size_t NC = size_t(N * C);
  auto act = [&](size_t n, int64_t row) { return activation(n, row, values, gen); };
  auto zeros = [](size_t n) { return std::vector<double>(n, 0.0); };
  // An output the op overwrites starts as NaN, as training's buffers hold the last step's values:
  // a kernel that reads it (adds into it, assumes it zeroed) gives NaN where the reference
  // does not.
  auto fp32 = [](std::vector<double> v) {
    round_to_fp32(v);
    return v;
  };
  auto stale = [](size_t n) { return std::vector<double>(n, std::nan("")); };
  OpInputs x;
  x.ids = ids;
  switch (op_named(op)) {
    case Op::embedding_forward:
      x.values = {normal(size_t(V * C), gen), normal(size_t(T * C), gen)};
      x.outputs = {stale(NC)};
      break;
    case Op::rmsnorm_forward:
      x.values = {act(NC, C), normal(size_t(C), gen, 1.0)};
      x.outputs = {stale(NC), stale(size_t(N))};
      break;
    case Op::rmsnorm_backward: {
      auto xs = act(NC, C);
      auto rstd = rstd_of(xs, N, C);
      x.values = {act(NC, C), std::move(xs), normal(size_t(C), gen, 1.0), std::move(rstd)};
      x.outputs = {zeros(NC), zeros(size_t(C))};
      break;
    }
    case Op::linear_forward:
      x.values = {act(NC, C), normal(size_t(V * C), gen)};
      x.outputs = {stale(size_t(N * V))};
      break;
    case Op::linear_backward:
      x.values = {act(size_t(N * V), V), act(NC, C), normal(size_t(V * C), gen)};
      x.outputs = {stale(NC), zeros(size_t(V * C))};
      break;
    case Op::attention_forward:
      x.values = {act(3 * NC, 3 * C)};
      x.outputs = {stale(NC), zeros(size_t(B * NH * T * T))};
      break;
    case Op::attention_backward: {
      std::vector<double> qkv = act(3 * NC, 3 * C);
      std::vector<double> saved = reference_attention_state(qkv, s);
      x.values = {act(NC, C), std::move(qkv), std::move(saved)};
      x.outputs = {stale(3 * NC)};
      break;
    }
    case Op::gelu_forward:
    case Op::cast:
      x.values = {act(NC, C)};
      x.outputs = {stale(NC)};
      break;
    case Op::gelu_backward:
    case Op::add:  // two [N, C] inputs, one [N, C] output
      x.values = {act(NC, C), act(NC, C)};
      x.outputs = {stale(NC)};
      break;
    case Op::cross_entropy:
      x.values = {act(size_t(N * V), V)};
      x.outputs = {stale(size_t(N)), stale(size_t(N * V))};
      break;
    case Op::embed_rmsnorm_backward: {
      // Gradients with a per-channel mean shared by every row, as a step's gradients of one
      // token's occurrences tend to share a direction: a hot row's contributions add up
      // coherently.
      const std::vector<double> mean = normal(size_t(C), gen);
      auto grad = [&] {
        // (Rows of mixed scale: each row with its mean, scaled whole.)
        const bool rows = values == Values::RowScales;
        std::vector<double> g = rows ? activation(NC, C, Values::Normal, gen) : act(NC, C);
        const double scale = values == Values::Tiny ? 1e-10 : values == Values::Large ? 1e3 : 1.0;
        for (size_t i = 0; i < NC; ++i) g[i] += scale * mean[i % size_t(C)];
        if (rows) scale_rows(g, C, gen);
        return g;
      };
      auto x0 = act(NC, C);
      auto rstd = rstd_of(x0, N, C);
      auto dy = grad(), dresid = grad();
      x.values = {std::move(dy), std::move(dresid), std::move(x0), normal(size_t(C), gen, 1.0),
                  std::move(rstd)};
      x.outputs = {zeros(size_t(V * C)), zeros(size_t(T * C)), zeros(size_t(C))};
      break;
    }
    // The flat-vector ops see the [N, C] activations as one vector of N C values: the gradient
    // takes the value condition; parameters and optimizer state are what training leaves there.
    case Op::sum_squares:
      x.values = {act(NC, C)};
      x.outputs = {stale(1)};
      break;
    // Parameters and optimizer state are fp32 in training: values an fp32 kernel holds exactly,
    // so one that leaves a state as it was (SGD without momentum) changes it by nothing.
    case Op::sgd_step:
      x.values = {act(NC, C)};
      x.outputs = {fp32(normal(NC, gen)), fp32(normal(NC, gen))};  // parameters, momentum
      break;
    case Op::adamw_step: {
      std::vector<double> second = normal(NC, gen);
      for (auto& v : second) v = v * v * 1e-2;  // a second moment: positive, below 1
      x.values = {act(NC, C)};
      x.outputs = {fp32(normal(NC, gen)), fp32(normal(NC, gen)), fp32(std::move(second))};
      break;
    }
    case Op::grad_reduce:  // B ranks' gradients of T C values each, stacked
      x.values = {act(NC, T * C)};
      x.outputs = {stale(size_t(T * C))};
      break;
    case Op::rope_forward:
    case Op::rope_backward:  // the packed q | k | v rows of NH + 2 NKV heads
      x.values = {act(size_t(N * (NH + 2 * s.NKV()) * (C / NH)), (NH + 2 * s.NKV()) * (C / NH))};
      x.outputs = {stale(x.values[0].size())};
      break;
    case Op::gqa_forward:
      x.values = {act(size_t(N * (NH + 2 * s.NKV()) * (C / NH)), (NH + 2 * s.NKV()) * (C / NH))};
      x.outputs = {stale(3 * NC)};
      break;
    case Op::gqa_backward:
      x.values = {act(3 * NC, 3 * C)};
      x.outputs = {stale(size_t(N * (NH + 2 * s.NKV()) * (C / NH)))};
      break;
    case Op::swiglu_forward:  // F = C: rows of gate | up, 2C wide
      x.values = {act(2 * NC, 2 * C)};
      x.outputs = {stale(NC)};
      break;
    case Op::swiglu_backward:
      x.values = {act(NC, C), act(2 * NC, 2 * C)};
      x.outputs = {stale(2 * NC)};
      break;
    case Op::softcap_forward:  // logits: [N, V]
      x.values = {act(size_t(N * V), V)};
      x.outputs = {stale(size_t(N * V))};
      break;
    case Op::softcap_backward:
      x.values = {act(size_t(N * V), V), act(size_t(N * V), V)};
      x.outputs = {stale(size_t(N * V))};
      break;
    case Op::add_rmsnorm_forward:  // the stream, a block's output, the gain
      x.values = {act(NC, C), act(NC, C), normal(size_t(C), gen, 1.0)};
      x.outputs = {stale(NC), stale(NC), stale(size_t(N))};
      break;
    case Op::count:
      throw std::logic_error("op_inputs: Op::count is not an op");
  }
  return x;
}

std::vector<double> reference_attention_state(const std::vector<double>& qkv, const OpShape& s) {
  OpInputs fwd;
  fwd.values = {qkv};
  fwd.outputs = {std::vector<double>(size_t(s.tokens() * s.C), 0.0),
                 std::vector<double>(size_t(int64_t(s.B) * s.NH * s.T * s.T), 0.0)};
  OpRun ref = call_op("attention_forward", cpu_catalogue<double>().select({}), fwd, s);
  return std::move(ref.outputs[1]);
}

OpShape shape_of_call(const std::string& op, const std::vector<double>& values) {
  auto at = [&](size_t i) {
    if (i >= values.size()) throw std::logic_error("shape_of_call: too few values for " + op);
    return int(values[i]);
  };
  OpShape s;
  switch (op_named(op)) {
    case Op::embedding_forward:  // B, T, C, V
    case Op::embed_rmsnorm_backward:
      s.B = at(0), s.T = at(1), s.C = at(2), s.V = at(3);
      break;
    case Op::attention_forward:  // B, T, C, NH
    case Op::attention_backward:
      s.B = at(0), s.T = at(1), s.C = at(2), s.NH = at(3);
      break;
    case Op::add_rmsnorm_forward:  // B, T, C, eps
      s.B = at(0), s.T = at(1), s.C = at(2);
      break;
    case Op::rmsnorm_forward:  // N, C (, eps)
    case Op::rmsnorm_backward:
    case Op::swiglu_forward:  // N, F
    case Op::swiglu_backward:
      s.T = at(0), s.C = at(1);
      break;
    case Op::linear_forward:  // N, in, out
    case Op::linear_backward:
      s.T = at(0), s.C = at(1), s.V = at(2);
      break;
    case Op::cross_entropy:  // N, V, dloss
      s.T = at(0), s.V = at(1);
      break;
    case Op::rope_forward:  // B, T, NH, NKV, HD, base
    case Op::rope_backward:
      s.B = at(0), s.T = at(1), s.NH = at(2), s.kv_heads = at(3), s.C = at(2) * at(4);
      break;
    case Op::gqa_forward:  // N, NH, NKV, HD
    case Op::gqa_backward:
      s.T = at(0), s.NH = at(1), s.kv_heads = at(2), s.C = at(1) * at(3);
      break;
    case Op::gelu_forward:  // n values, seen as one row
    case Op::gelu_backward:
    case Op::add:
    case Op::cast:
    case Op::sum_squares:
    case Op::sgd_step:
    case Op::adamw_step:
      s.C = at(0);
      break;
    case Op::grad_reduce:  // ranks, n: B ranks of one row of n values
      s.B = at(0), s.C = at(1);
      break;
    case Op::softcap_forward:  // n logits: call_op passes N V
    case Op::softcap_backward:
      s.V = at(0);
      break;
    case Op::count:
      throw std::logic_error("shape_of_call: Op::count is not an op");
  }
  return s;
}

// Every scalar drawn from a range, not from a few values: a kernel that hard-codes one (momentum
// 0.9 whenever it is on, AdamW's eps, the RoPE base) fails on the draws that differ. Each value is
// rounded to fp32, as the kernels receive it, so the fp64 reference computes with the same one.
OpScalars random_scalars(std::mt19937_64& gen, Values values) {
  auto uniform = [&](double lo, double hi) {
    return double(float(std::uniform_real_distribution<double>(lo, hi)(gen)));
  };
  auto log_uniform = [&](double lo, double hi) {
    return double(
        float(std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi))(gen))));
  };
  auto one_in = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(gen) == 0; };
  OpScalars c;
  c.eps = log_uniform(1e-7, 1e-4);
  // Gradient accumulation over k micro-batches divides the loss's gradient by k.
  c.dloss_scale = 1.0 / std::uniform_int_distribution<int>(1, 16)(gen);
  c.lr = log_uniform(0.01, 0.3);
  c.momentum = one_in(3) ? 0.0 : uniform(0.5, 0.99);
  c.nesterov = one_in(2);
  c.weight_decay = log_uniform(1e-3, 0.1);  // off in a third of the draws (the last draw)
  c.grad_scale = one_in(3) ? 1.0 : uniform(0.1, 1.0);
  c.adam_lr = log_uniform(1e-4, 1e-2);
  c.beta1 = uniform(0.8, 0.95);
  c.beta2 = uniform(0.9, 0.9999);
  c.adam_eps = log_uniform(1e-10, 1e-6);
  c.adam_weight_decay = one_in(3) ? 0.0 : log_uniform(1e-3, 0.1);
  // Bias correction's first steps, where it matters most, and far into a run.
  c.step = one_in(2) ? std::uniform_int_distribution<int64_t>(1, 20)(gen)
                     : int64_t(log_uniform(20, 1e5));
  c.rope_base = log_uniform(1e3, 1e6);
  c.softcap = uniform(5, 100);
  // SGD without weight decay, as training runs it by default (train.weight_decay = 0; with
  // momentum off too, plain SGD): a kernel with a path of its own for zero decay runs it here.
  // Not plain SGD on values x1e-10, where the update (lr g) is below an fp32 parameter's ulp:
  // momentum or decay must leave a change an fp32 kernel can hold. Drawn last, so a seed
  // replays the scalars drawn before it.
  if (one_in(3) && !(values == Values::Tiny && c.momentum == 0)) c.weight_decay = 0;
  return c;
}

std::string scalars_text(const std::string& op, const OpScalars& c) {
  auto num = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  switch (op_named(op)) {
    case Op::rmsnorm_forward:
    case Op::add_rmsnorm_forward:
      return "eps " + num(c.eps);
    case Op::cross_entropy:
      return c.with_gradient ? "dloss " + num(c.dloss_scale) + "/N" : "loss only";
    case Op::sgd_step:
      return "lr " + num(c.lr) + ", momentum " + num(c.momentum) +
             (c.nesterov ? " (Nesterov)" : "") + ", weight decay " + num(c.weight_decay) +
             ", gradient scale " + num(c.grad_scale);
    case Op::adamw_step:
      return "lr " + num(c.adam_lr) + ", betas " + num(c.beta1) + " " + num(c.beta2) + ", eps " +
             num(c.adam_eps) + ", weight decay " + num(c.adam_weight_decay) + ", gradient scale " +
             num(c.grad_scale) + ", step " + std::to_string(c.step);
    case Op::rope_forward:
    case Op::rope_backward:
      return "base " + num(c.rope_base);
    case Op::softcap_forward:
    case Op::softcap_backward:
      return "cap " + num(c.softcap);
    default:
      return "";
  }
}

OpScalars scalars_of_call(const std::string& op, const std::vector<double>& values) {
  auto at = [&](size_t i) {
    if (i >= values.size()) throw std::logic_error("scalars_of_call: too few values for " + op);
    return values[i];
  };
  OpScalars c;
  switch (op_named(op)) {
    case Op::rmsnorm_forward:  // N, C, eps
      c.eps = at(2);
      break;
    case Op::add_rmsnorm_forward:  // B, T, C, eps
      c.eps = at(3);
      break;
    case Op::cross_entropy:  // N, V, dloss
      c.dloss_scale = at(2) * at(0);
      break;
    case Op::sgd_step:  // n, lr, momentum, nesterov, weight_decay, grad_scale
      c.lr = at(1), c.momentum = at(2), c.nesterov = at(3) != 0, c.weight_decay = at(4),
      c.grad_scale = at(5);
      break;
    case Op::adamw_step:  // n, lr, beta1, beta2, eps, weight_decay, grad_scale, step
      c.adam_lr = at(1), c.beta1 = at(2), c.beta2 = at(3), c.adam_eps = at(4),
      c.adam_weight_decay = at(5), c.grad_scale = at(6), c.step = int64_t(at(7));
      break;
    case Op::rope_forward:  // B, T, NH, NKV, HD, base
    case Op::rope_backward:
      c.rope_base = at(5);
      break;
    case Op::softcap_forward:  // n, cap
    case Op::softcap_backward:
      c.softcap = at(1);
      break;
    default:
      break;
  }
  return c;
}

template <class KS>
ActivationStorage activation_storage(const std::string& op, const KS& k, const OpInputs& x,
                                     const OpShape& s) {
  std::vector<ArgProbe> in(x.values.size()), out(x.outputs.size());
  invoke_op(op_named(op), no_op_kernels(k), OpContext{}, in, nullptr, out, s, x.scalars, nullptr);
  const auto narrower = [](const std::vector<ArgProbe>& probes) {
    std::vector<bool> activation(probes.size());
    for (size_t i = 0; i < probes.size(); ++i)
      activation[i] =
          probes[i].value_bytes != 0 && probes[i].value_bytes < sizeof(typename KS::Value);
    return activation;
  };
  return {narrower(in), narrower(out)};
}

template <class KS>
OpRun call_op(const std::string& op, const KS& k, const OpInputs& x, const OpShape& s,
              std::vector<ArgSpec>* written, const KernelCallMarks* marks) {
  // A plug-in's writes past the scratch it asked for join the call's writes outside its outputs.
  GuardedContexts contexts(*k.memory, kPluginWorkspaceSlot);
  const OpContext ctx = contexts.next();
  OpRun r = run_op(k, x, [&](const KS& kk, auto& in, const TokenId* ids, auto& out) {
    if (marks) marks->begin();
    invoke_op(op_named(op), kk, ctx, in, ids, out, s, x.scalars, written);
    if (marks) kk.memory->synchronize(ctx.stream), marks->end();
  });
  contexts.add_stray_writes(&r.stray_writes);
  return r;
}

namespace {
// The heap's bytes in use (malloc'd and mmap'd chunks: exact, whatever the heap returns to the
// system) and the device's. The device first: its first reading loads the driver's library
// (kernels/cuda/process_memory.cpp), whose heap must not count as the kernel's.
MemoryGrowth memory_in_use(const MemoryOps& memory) {
  MemoryGrowth m;
  m.device = memory.bytes_in_use ? int64_t(memory.bytes_in_use()) : 0;
  const struct mallinfo2 heap = mallinfo2();
  m.host = int64_t(heap.uordblks + heap.hblkhd);
  return m;
}
}  // namespace

template <class KS>
OpRun call_op_in_place_after(const std::string& op, const KS& k, const OpInputs& first, int earlier,
                             const OpInputs& x, const OpShape& s, MemoryGrowth* leak) {
  using Clock = std::chrono::steady_clock;
  GuardedContexts contexts(*k.memory, kPluginWorkspaceSlot);
  BoundCall b(*k.memory, first);
  const bool probe = leak != nullptr && earlier > kLeakFrom;
  const bool device = k.memory->bytes_in_use != nullptr;
  // Readings after calls kLeakFrom, a quarter further, ..., `earlier`; on a device each quarter's
  // calls are followed by as long a wait and another reading (`idle`), so that another process's
  // allocations during the calls can be told from the kernel's own: they go on while it waits.
  std::array<MemoryGrowth, 5> at, idle;
  std::array<Clock::time_point, 5> at_time, idle_time;
  for (int i = 0; i < earlier; ++i) {
    if (i > 0) b.refill(first);  // outputs the op adds into start from the same values each time
    const OpContext ctx = contexts.next();
    invoke_op(op_named(op), k, ctx, b.in, b.id_data(), b.out, s, first.scalars, nullptr);
    k.memory->synchronize(ctx.stream);  // the refill's uploads must not overtake the call
    if (!probe) continue;
    for (size_t q = 0; q <= 4; ++q) {
      if (i + 1 != kLeakFrom + (earlier - kLeakFrom) * int(q) / 4) continue;
      at[q] = idle[q] = memory_in_use(*k.memory);
      at_time[q] = idle_time[q] = Clock::now();
      if (device && q > 0) {
        std::this_thread::sleep_for(at_time[q] - idle_time[q - 1]);
        idle[q] = memory_in_use(*k.memory);
        idle_time[q] = Clock::now();
      }
    }
  }
  if (probe) {
    leak->host = at[4].host - at[0].host, leak->calls = earlier - kLeakFrom;
    leak->device = 0;
    for (size_t q = 0; q < 4 && device; ++q) {
      // What the device gained during the quarter's calls, less what it gained at the same rate
      // while waiting (as long, or a little longer when woken late).
      const double calls = std::chrono::duration<double>(at_time[q + 1] - idle_time[q]).count();
      const double waited =
          std::chrono::duration<double>(idle_time[q + 1] - at_time[q + 1]).count();
      const double meanwhile = double(idle[q + 1].device - at[q + 1].device);
      const int64_t own = at[q + 1].device - idle[q].device -
                          int64_t(waited > 0 ? meanwhile * calls / waited : 0.0);
      leak->device_quarters[q] = own;
      leak->device += own;
    }
  }
  b.refill(x);
  invoke_op(op_named(op), k, contexts.next(), b.in, b.id_data(), b.out, s, x.scalars, nullptr);
  OpRun r = b.read();
  contexts.add_stray_writes(&r.stray_writes);
  return r;
}

template <class KS>
PreparedCall<KS>::PreparedCall(const std::string& op, const KS& k, OpInputs x, const OpShape& s)
    : op_(op_named(op)),
      k_(k),
      x_(std::move(x)),
      s_(s),
      arrays_(*k.memory, x_),
      contexts_(*k.memory, kPluginWorkspaceSlot) {
  invoke_op(op_, no_op_kernels(k_), contexts_.next(), arrays_.in, arrays_.id_data(), arrays_.out,
            s_, x_.scalars, nullptr);
}

template <class KS>
void PreparedCall<KS>::launch(void* stream) {
  OpContext ctx = contexts_.next();
  ctx.stream = stream_ = stream;
  invoke_op(op_, k_, ctx, arrays_.in, arrays_.id_data(), arrays_.out, s_, x_.scalars, nullptr);
}

template <class KS>
void PreparedCall<KS>::reset() {
  for (BoundArray& o : arrays_.out) o.rewrite();
}

template <class KS>
OpRun PreparedCall<KS>::read() {
  k_.memory->synchronize(stream_);
  OpRun r = arrays_.read();
  contexts_.add_stray_writes(&r.stray_writes);
  return r;
}

template OpRun call_op(const std::string&, const KernelSet<double>&, const OpInputs&,
                       const OpShape&, std::vector<ArgSpec>*, const KernelCallMarks*);
template OpRun call_op(const std::string&, const KernelSet<float>&, const OpInputs&, const OpShape&,
                       std::vector<ArgSpec>*, const KernelCallMarks*);
template OpRun call_op(const std::string&, const KernelSet<float, bf16>&, const OpInputs&,
                       const OpShape&, std::vector<ArgSpec>*, const KernelCallMarks*);
template OpRun call_op_in_place_after(const std::string&, const KernelSet<double>&, const OpInputs&,
                                      int, const OpInputs&, const OpShape&, MemoryGrowth*);
template OpRun call_op_in_place_after(const std::string&, const KernelSet<float>&, const OpInputs&,
                                      int, const OpInputs&, const OpShape&, MemoryGrowth*);
template OpRun call_op_in_place_after(const std::string&, const KernelSet<float, bf16>&,
                                      const OpInputs&, int, const OpInputs&, const OpShape&,
                                      MemoryGrowth*);
template ActivationStorage activation_storage(const std::string&, const KernelSet<double>&,
                                              const OpInputs&, const OpShape&);
template ActivationStorage activation_storage(const std::string&, const KernelSet<float>&,
                                              const OpInputs&, const OpShape&);
template ActivationStorage activation_storage(const std::string&, const KernelSet<float, bf16>&,
                                              const OpInputs&, const OpShape&);
template class PreparedCall<KernelSet<double>>;
template class PreparedCall<KernelSet<float>>;
template class PreparedCall<KernelSet<float, bf16>>;

}  // namespace divlab
