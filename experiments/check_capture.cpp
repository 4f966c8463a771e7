#include "experiments/check_capture.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/errors.h"
#include "common/files.h"
#include "datasets/dataset.h"
#include "experiments/config.h"
#include "experiments/data_parallel.h"
#include "experiments/weights.h"
#include "io/trace.h"
#include "kernels/backend.h"
#include "kernels/op_spec.h"
#include "model/optimizer.h"
#include "model/transformer.h"

namespace divlab {

namespace {

// One recorded call: every array as doubles (exact for every storage type), in argument order.
struct Recorded {
  std::vector<std::vector<double>> inputs;
  // What the written arrays held before the call (an update reads its weights and moments), or
  // zeros at their sizes.
  std::vector<std::vector<double>> outputs;
  std::vector<TokenId> ids;
  std::vector<double> values;  // sizes and scalars
};

template <class T, class A>
struct Recorder {
  KernelSet<T, A> inner;
  bool keep_outputs = false;  // the updates read their outputs (weights, moments)
  std::vector<Recorded> calls;
};

template <class V>
std::vector<double> widen(const V* p, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = to_double(p[i]);
  return out;
}

template <class V>
void record_arg(Recorded& c, const ArgSpec& spec, V v, bool keep_outputs) {
  if constexpr (std::is_pointer_v<V>) {
    using E = std::remove_const_t<std::remove_pointer_t<V>>;
    if constexpr (std::is_same_v<E, TokenId>) {
      if (v) c.ids.assign(v, v + spec.size());
    } else if (spec.role == ArgRole::Input) {
      c.inputs.push_back(widen(v, spec.size()));
    } else if (keep_outputs && v) {
      c.outputs.push_back(widen(v, spec.size()));
    } else {  // zeroed, as check's own draws start them
      c.outputs.emplace_back(static_cast<size_t>(spec.size()), 0.0);
    }
  } else {
    c.values.push_back(double(v));
  }
}

// The kernel for `op` that records each call's arguments, then runs the reference.
template <Op op, class T, class A, class Fn>
struct Recording;
template <Op op, class T, class A, class... Args>
struct Recording<op, T, A, void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& ctx, Args... args) {
    auto& r = *static_cast<Recorder<T, A>*>(ctx.state);
    const std::tuple<Args...> a(args...);
    const auto spec = OpSpec<op>::args(a);
    Recorded c;
    size_t i = 0;
    std::apply([&](auto... v) { ((record_arg(c, spec[i], v, r.keep_outputs), ++i), ...); }, a);
    r.calls.push_back(std::move(c));
    (r.inner.*kernel_member<op, T, A>())(ctx, args...);
  }
};

template <class T, class A>
KernelSet<T, A> recording(Recorder<T, A>& r, Op which) {
  KernelSet<T, A> k = r.inner;
  using S = OpSignatures<T, A>;
// Op names and signatures are pasted into member names and template arguments only.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_RECORD_OP(name, Signature) \
  if constexpr (OpSpec<Op::name>::known)  \
    if (which == Op::name) k.name = {&Recording<Op::name, T, A, typename S::Signature>::call, &r};
  DIVLAB_OPS(DIVLAB_RECORD_OP)
#undef DIVLAB_RECORD_OP
  // NOLINTEND(bugprone-macro-parentheses)
  return k;
}

bool is_update(Op op) {
  return op == Op::sgd_step || op == Op::adamw_step;
}

// Does a run of `cfg` call `op`? The model's ops, the bf16 weight copy in bf16 mode, the norm,
// the configured optimizer's update, and the gradient reduction of a data-parallel run.
bool run_calls(const RunConfig& cfg, Op op) {
  switch (op) {
    case Op::cast:
      return cfg.precision == Precision::Bf16;
    case Op::sgd_step:
      return cfg.optim.kind == OptimizerKind::Sgd;
    case Op::adamw_step:
      return cfg.optim.kind == OptimizerKind::AdamW;
    case Op::grad_reduce:
      return cfg.ranks > 1;
    default:
      return model_calls(cfg.model, op);
  }
}

RunConfig trace_config(const std::string& trace) {
  require_input_file(trace, "check --trace", ", not a trace (a run's --out file)");
  const TraceReader r(trace);
  if (!r.has_attr("/", "config_toml"))
    throw InputError("check --trace '" + trace + "': the trace holds no run config");
  return parse_config_text(r.string_attr("/", "config_toml"), trace, {}, ConfigFrom::Trace);
}

struct NewestWeights {
  std::optional<TraceWeights> found;
  std::string source;
};

// The newest weights the trace keeps whose values are all finite: a run that blew up keeps NaN
// final weights, on which every op's inputs would be NaN and no comparison says anything.
NewestWeights newest_weights(const std::string& trace, const std::vector<ParamInfo>& layout) {
  const TraceReader r(trace);
  std::string skipped;
  for (const WhichWeights which :
       {WhichWeights::Final, WhichWeights::Checkpoint, WhichWeights::Initial}) {
    auto w = trace_weights(r, which, layout);
    if (!w) continue;
    const std::string source =
        std::string(which == WhichWeights::Checkpoint ? "its newest checkpoint" : name_of(which)) +
        " (step " + std::to_string(w->step) + ")";
    if (!std::all_of(w->params.begin(), w->params.end(),
                     [](double x) { return std::isfinite(x); })) {
      skipped += (skipped.empty() ? "" : ", ") + source;
      continue;
    }
    return {std::move(w), source + (skipped.empty() ? "" : "; newer: " + skipped + ", not finite")};
  }
  if (!skipped.empty())
    throw InputError("check --trace '" + trace + "': every set of weights it keeps holds NaN or " +
                     "inf (" + skipped + "): no finite values to judge the op on");
  return {std::nullopt, "initialisation (the trace keeps no weights: drawn from the run's seed)"};
}

// One step of the run's model on one sequence, recording every call of `op`.
template <class T, class A>
std::vector<Recorded> record_step(const RunConfig& cfg, const Dataset& data,
                                  const std::optional<TraceWeights>& weights, Op op) {
  // A data-parallel run's reduction is recorded over one sequence per rank.
  const int ranks = op == Op::grad_reduce ? cfg.ranks : 1;
  try {  // memory predicted before it is allocated
    check_backend_fits(Backend::Cpu,
                       size_t(Transformer<T, A>::allocated_bytes(cfg.model, 1) +
                              DataParallelStep<T, A>::extra_bytes(ranks, param_count(cfg.model))),
                       "check --trace: the run's model at one sequence");
  } catch (const BackendError& e) {
    throw InputError(e.what());
  }
  Recorder<T, A> rec;
  rec.inner = backend_catalogue<T, A>(Backend::Cpu, cfg.precision).select({});
  rec.keep_outputs = is_update(op);
  const KernelSet<T, A> kernels = recording(rec, op);
  Transformer<T, A> model(cfg.model, kernels, 1);
  model.init(cfg.seed);
  const int64_t step = weights ? weights->step : 0;
  if (weights) {
    const std::vector<T> host(weights->params.begin(), weights->params.end());
    model.params().upload(host.data(), int64_t(host.size()));
  }
  const int T_ = cfg.model.seq_len;
  std::vector<TokenId> in(size_t(cfg.batch) * T_), tgt(in.size());
  data.batch(step, cfg.batch, T_, in.data(), tgt.data());
  if (op == Op::grad_reduce) {  // the batch's first `ranks` sequences, one per rank
    DataParallelStep<T, A>(model, ranks).run(in.data(), tgt.data(), cfg.seed, step);
    return std::move(rec.calls);
  }
  model.forward(in.data(), tgt.data(), true);  // the batch's first sequence
  model.backward();
  if (op == Op::sum_squares || is_update(op)) {
    Optimizer<T> optim(cfg.optim, model.layout(), *kernels.memory);
    optim.step(model, step);
  }
  return std::move(rec.calls);
}

CapturedCall to_check_inputs(const std::string& op, Recorded c) {
  CapturedCall out;
  out.shape = shape_of_call(op, c.values);
  out.inputs.scalars = scalars_of_call(op, c.values);
  out.inputs.values = std::move(c.inputs);
  out.inputs.ids = std::move(c.ids);
  out.inputs.outputs = std::move(c.outputs);
  if (op == "attention_backward")  // the run's saved state is in its own forward's format
    out.inputs.values.at(2) = reference_attention_state(out.inputs.values.at(1), out.shape);
  return out;
}

// At most `most` indices of n, spread evenly from the first to the last.
std::vector<size_t> spread(size_t n, size_t most) {
  std::vector<size_t> picked;
  if (n <= most) {
    for (size_t i = 0; i < n; ++i) picked.push_back(i);
  } else if (most == 1) {
    picked.push_back(0);
  } else {
    for (size_t k = 0; k < most; ++k) picked.push_back(k * (n - 1) / (most - 1));
  }
  return picked;
}

}  // namespace

void check_capture_source(const std::string& trace, const std::string& op) {
  const RunConfig cfg = trace_config(trace);
  Op o{};
  if (!parse_op(op, &o)) throw InputError("check: no op '" + op + "'");
  if (!run_calls(cfg, o))
    throw InputError("check --trace '" + trace + "': its run never calls " + op + " (model " +
                     name_of(cfg.model.arch) + ", precision " + name_of(cfg.precision) +
                     ", optimizer " + name_of(cfg.optim.kind) + ", train.ranks " +
                     std::to_string(cfg.ranks) + ")");
}

TraceCapture capture_op_calls(const std::string& trace, const std::string& op, size_t max_calls) {
  check_capture_source(trace, op);
  const RunConfig cfg = trace_config(trace);
  Op o{};
  parse_op(op, &o);
  NewestWeights w = newest_weights(trace, param_layout(cfg.model));
  DatasetOptions dopt;
  dopt.vocab = cfg.model.vocab, dopt.seq_len = cfg.model.seq_len, dopt.seed = cfg.seed;
  dopt.verbose = false;
  const auto data = make_dataset(cfg.data, dopt);
  std::vector<Recorded> calls;
  if (cfg.precision == Precision::Fp64)
    calls = record_step<double, double>(cfg, *data, w.found, o);
  else if (cfg.precision == Precision::Bf16)
    calls = record_step<float, bf16>(cfg, *data, w.found, o);
  else
    calls = record_step<float, float>(cfg, *data, w.found, o);
  TraceCapture out;
  out.source = w.source;
  const size_t n = calls.size();
  for (size_t i : spread(n, max_calls)) {
    CapturedCall c = to_check_inputs(op, std::move(calls[i]));
    c.where = "call " + std::to_string(i + 1) + " of " + std::to_string(n);
    out.calls.push_back(std::move(c));
  }
  return out;
}

}  // namespace divlab
