#include "experiments/check.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "common/rng.h"
#include "datasets/dataset.h"
#include "experiments/check_capture.h"
#include "experiments/check_conditions.h"
#include "experiments/check_judge.h"
#include "experiments/config.h"
#include "kernels/backend.h"
#include "kernels/common/parallel.h"
#include "kernels/harness.h"
#include "kernels/memory.h"
#include "kernels/op_cases.h"
#include "kernels/plugins.h"

namespace divlab {

namespace {

// The verdict's criteria, printed with every report.
constexpr int kShrinkTries = 100;              // candidate shapes tried when shrinking one failure
constexpr uint64_t kScalarStream = 0x5ca1a75;  // a draw's scalars' generator: its seed ^ this
constexpr size_t kTraceCalls = 3;              // recorded calls judged under "values from trace"
// The concurrent-load condition: copies of one call on several streams, between GEMMs of a size
// that keeps every SM of an H100 busy for tens of microseconds each on another stream.
constexpr int kLoadStreams = 4, kConcurrentCopies = 8, kLoadGemmsPerCopy = 2;
// How long each copy's stream waits before its inputs arrive: far longer than the host takes to
// queue every copy, so a kernel that runs outside its stream runs before they arrive.
constexpr double kStreamHoldSeconds = 0.02;
constexpr OpShape kLoadGemm{1, 2048, 1024, 1, 2048};  // [2048 x 1024] x [1024 x 2048]

// Whether a check at `precision` gives `op` bf16 values: the bf16 mode, and an op with arrays in
// the activations' storage.
bool bf16_values(Precision precision, const std::string& op) {
  Op which{};
  return precision == Precision::Bf16 && parse_op(op, &which) && op_has_activations(which);
}

// Every op: kernels/op_cases.cpp builds inputs for each one and calls it.
const std::vector<std::string>& checkable_ops() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> all;
    all.reserve(kOpCount);
    for (int i = 0; i < kOpCount; ++i) all.emplace_back(op_name(Op(i)));
    return all;
  }();
  return ops;
}

// The token streams of the distribution conditions, built once per check (Brown's tokenizer
// takes a moment), keyed by spec and shape.
class TokenStreams {
 public:
  const Dataset* get(const std::string& kind, const OpShape& s, uint64_t seed, std::string* note) {
    const std::string key = kind + " " + s.text();
    auto it = streams_.find(key);
    if (it == streams_.end()) {
      DatasetOptions o;
      o.vocab = s.V, o.seq_len = s.T, o.seed = seed;
      std::unique_ptr<Dataset> d;
      try {
        d = make_dataset(kind, o);
      } catch (const InputError& e) {
        *note = e.what();
      }
      it = streams_.emplace(key, std::move(d)).first;
    }
    return it->second.get();
  }

 private:
  std::map<std::string, std::unique_ptr<Dataset>> streams_;
};

// Token ids for draw `draw` of a condition; empty with `note` set when the data cannot be had
// here.
std::vector<TokenId> make_tokens(const std::string& kind, const OpShape& s, std::mt19937_64& gen,
                                 int64_t draw, uint64_t seed, TokenStreams& streams,
                                 std::string* note) {
  if (kind == "uniform") return uniform_tokens(s, gen);
  const int64_t N = s.tokens();
  if (kind == "rows") {  // every id but one in seven (id 0 and V-1 present), then repeats
    std::vector<TokenId> ids;
    for (int v = 0; v < s.V && int64_t(ids.size()) < N; ++v)
      if (v % 7 != 3) ids.push_back(TokenId(v));
    const size_t present = ids.size();
    while (int64_t(ids.size()) < N) ids.push_back(ids[gen() % present]);
    std::shuffle(ids.begin(), ids.end(), gen);
    return ids;
  }
  if (kind == "hot") {  // one id (its draw's) at all positions but one in 32, the rest uniform
    const auto hot = TokenId(gen() % uint64_t(s.V));
    std::vector<TokenId> ids = uniform_tokens(s, gen);
    for (int64_t n = 0; n < N; ++n)
      if (n % 32 != 31) ids[size_t(n)] = hot;
    return ids;
  }
  const Dataset* d = streams.get(kind, s, seed, note);
  if (!d) return {};
  const auto count = size_t(N);
  std::vector<TokenId> ids(count), targets(count);
  d->batch(draw, s.B, s.T, ids.data(), targets.data());  // each draw its own batch
  return ids;
}

// One check: the op, its fp64 reference and the variant (any storage types).
template <class KS>
struct Checker {
  const CheckOptions& opt;
  const std::string& op;
  const KernelSet<double>& reference;
  const KS& variant;
  const KS& backend_reference;  // the variant's catalogue's references (the concurrent load)
  Grade required;
  // bf16 precision, an op with activations: the reference sees the inputs as the kernel does,
  // its activations rounded to bf16 and the rest (T: fp32 there) to fp32.
  bool round_inputs;
  // There, its fp32 outputs judged at the fp32 grade (CheckReport::fp32_outputs_required).
  bool fp32_outputs;
  mutable TokenStreams streams;
  mutable std::optional<TraceCapture> recorded;     // --trace's calls, recorded when first needed
  mutable std::unique_ptr<PreparedCall<KS>> load;   // the concurrent condition's GEMM, bound once
  mutable const CheckProgress* progress = nullptr;  // run_all's, for draw()'s heartbeat
  mutable std::optional<ActivationStorage> bf16_arrays;  // which arrays are bf16, once known

  const ActivationStorage& storage(const OpInputs& x, const OpShape& s) const {
    if (!bf16_arrays) bf16_arrays = activation_storage(op, variant, x, s);
    return *bf16_arrays;
  }

  // `x`'s inputs as the bf16 mode's kernel receives them (round_inputs), for the reference too.
  void round_as_stored(OpInputs& x, const OpShape& s) const {
    if (!round_inputs) return;
    const std::vector<bool>& bf16 = storage(x, s).inputs;
    for (size_t i = 0; i < x.values.size(); ++i)
      (bf16.at(i) ? round_to_bf16 : round_to_fp32)(x.values[i]);
  }

  // Around the kernel's calls of a draw: the hang clock times them alone, not the fp64 work
  // around them.
  void kernel_calls_begin() const {
    if (progress && progress->kernel_calls) progress->kernel_calls();
  }
  void kernel_calls_end() const {
    if (progress && progress->own_work) progress->own_work();
  }
  // A verdict under the draw's condition, not an internal error; the kernel's time ends here.
  void kernel_threw(ConditionResult& r, const std::exception& e) const {
    kernel_calls_end();
    r.failed = true, r.finite = false, r.why = std::string("the kernel threw: ") + e.what();
  }
  // The same marks inside call_op, around the kernel alone: staging and reading back its arrays
  // (16.8 M values each under "arrays past 2^24") is divlab's work, which a busy host slows.
  KernelCallMarks kernel_call_marks() const {
    return {[this] { kernel_calls_begin(); }, [this] { kernel_calls_end(); }};
  }

  const TraceCapture& trace_calls() const {
    if (!recorded) recorded = capture_op_calls(opt.trace, op, kTraceCalls);
    return *recorded;
  }

  // rounding_allowance for the inputs rounded by `round` (to bf16 or to fp32): one more
  // reference call, made only for a draw past a bar.
  std::vector<double> input_rounding_allowance(const OpInputs& x, const OpShape& s,
                                               const OpRun& ref,
                                               const std::vector<ArgSpec>& written,
                                               void (*round)(std::vector<double>&)) const {
    OpInputs rounded = x;
    for (auto& values : rounded.values) round(values);
    return rounding_allowance(ref, call_op(op, reference, rounded, s), x.outputs, written);
  }

  // Per output, the error fp32 itself explains on `x`: twice the larger of the change rounding
  // the inputs to fp32 makes to the exact result and the backend's fp32 reference's distance
  // from it on the same inputs (an ill-conditioned input moves it even for an exact fp32 kernel).
  // A tiled condition's (`copies` > 0) call is the reference's tiled call too: a library may
  // take another algorithm, with other roundings, for a GEMM of 85 400 rows than for one of 61.
  std::vector<double> fp32_allowance(const OpInputs& x, const OpShape& s, const OpRun& ref,
                                     const std::vector<ArgSpec>& written, int copies) const {
    std::vector<double> allow = input_rounding_allowance(x, s, ref, written, round_to_fp32);
    OpRun backend;
    try {
      if (copies > 0) {  // its memory asked of the device first, as the variant's was
        check_backend_fits(opt.backend, tiled_call_bytes(op, backend_reference, x, s, copies),
                           "the reference's tiled call");
        backend = call_op_tiled(op, backend_reference, x, s, copies, ref);
      }
    } catch (const BackendError&) {  // no room for it: the base call's rounding
    } catch (const OutOfMemory&) {
    }
    if (backend.outputs.empty()) backend = call_op(op, backend_reference, x, s);
    const std::vector<double> own = rounding_allowance(ref, backend, x.outputs, written);
    for (size_t o = 0; o < allow.size(); ++o) allow[o] = std::max(allow[o], own[o]);
    return allow;
  }

  // `got` with the outputs a tiled call summed over its copies taken as the reference's, for the
  // fp32 grades: such a sum adds the same rows 1400 times over, a worst case for any order of
  // fp32 sums that no step's distinct rows reach (it is judged at 1e-2, as the base rows' share).
  static OpRun without_summed(const OpRun& got, const OpRun& ref) {
    OpRun graded = got;
    for (size_t o = 0; o < got.summed.size() && o < graded.outputs.size(); ++o)
      if (got.summed[o]) graded.outputs[o] = ref.outputs[o];
    return graded;
  }

  // `graded`'s error at the fp32 grade: its plain error, or where that is past 1e-4, what is
  // left beyond fp32_allowance; its worst element in `worst`.
  double fp32_grade_error(const OpInputs& x, const OpShape& s, int copies, const OpRun& ref,
                          const OpRun& graded, const std::vector<ArgSpec>& written,
                          const std::vector<std::vector<bool>>& nans, std::string* worst) const {
    ConditionResult m;
    measure(m, graded, ref, x.outputs, written, {}, nans);
    if (m.norm_error > kFp32Grade) {
      ConditionResult beyond;
      measure(beyond, graded, ref, x.outputs, written, fp32_allowance(x, s, ref, written, copies),
              nans);
      *worst = beyond.worst;
      return std::max(0.0, beyond.beyond_allowance);
    }
    *worst = m.worst;
    return m.norm_error;
  }

  // The bf16 mode's fp32 outputs at the fp32 grade (the bf16 outputs taken as the reference's:
  // judged on their own at the bf16 grade); -1 where every output is bf16.
  double fp32_outputs_error(const OpInputs& x, const OpShape& s, int copies, const OpRun& ref,
                            const OpRun& got, const std::vector<ArgSpec>& written,
                            const std::vector<std::vector<bool>>& nans, std::string* worst) const {
    const std::vector<bool>& bf16 = storage(x, s).outputs;
    if (std::all_of(bf16.begin(), bf16.end(), [](bool b) { return b; })) return -1;
    OpRun fp32_only = without_summed(got, ref);
    for (size_t o = 0; o < bf16.size() && o < fp32_only.outputs.size(); ++o)
      if (bf16[o]) fp32_only.outputs[o] = ref.outputs[o];
    return fp32_grade_error(x, s, copies, ref, fp32_only, written, nans, worst);
  }

  // kConcurrentCopies calls (one per input set), each run alone first, then all at once on
  // kLoadStreams streams while the backend's reference GEMM runs on another. Returns the call
  // whose outputs moved furthest from its run alone (`chosen`: judged like any draw, so a race
  // shows as error); `moved` says how many calls' bits moved at all.
  OpRun run_under_load(const std::vector<OpInputs>& inputs, const OpShape& s, std::string* moved,
                       size_t* chosen) const {
    const MemoryOps& mem = *variant.memory;
    if (!load) {
      std::mt19937_64 gen(0);
      load = std::make_unique<PreparedCall<KS>>(
          "linear_forward", backend_reference,
          op_inputs("linear_forward", kLoadGemm, {}, Values::Normal, gen), kLoadGemm);
      load->launch(nullptr);  // its scratch allocated now, not while the copies run
      load->read();
    }
    std::vector<std::unique_ptr<OwnedStream>> streams;
    for (int i = 0; i <= kLoadStreams; ++i) streams.push_back(std::make_unique<OwnedStream>(mem));
    void* load_stream = streams.back()->get();
    std::vector<std::unique_ptr<PreparedCall<KS>>> copies;
    std::vector<OpRun> alone;
    for (int c = 0; c < kConcurrentCopies; ++c) {
      copies.push_back(std::make_unique<PreparedCall<KS>>(op, variant, inputs[size_t(c)], s));
      copies.back()->launch(streams[0]->get());
      alone.push_back(copies.back()->read());
      copies.back()->reset();
    }
    // Every copy's inputs arrive on its stream behind a hold and a GEMM (poisoned until then), so
    // a kernel whose work is not ordered on the stream it is given reads the poison; the copies
    // queued behind the holds start together; the load stream keeps GEMMs running meanwhile.
    for (auto& copy : copies) copy->poison_inputs();
    for (int i = 0; i < kLoadStreams; ++i) {
      if (mem.hold) mem.hold(streams[size_t(i)]->get(), kStreamHoldSeconds);
      load->launch(streams[size_t(i)]->get());
    }
    for (int c = 0; c < kConcurrentCopies; ++c) {
      for (int g = 0; g < kLoadGemmsPerCopy; ++g) load->launch(load_stream);
      copies[size_t(c)]->launch_staged(streams[size_t(c % kLoadStreams)]->get());
    }
    OpRun furthest;
    double furthest_by = -1;
    int moved_copies = 0;
    for (int c = 0; c < kConcurrentCopies; ++c) {
      OpRun got = copies[size_t(c)]->read();
      double by = 0;
      for (size_t o = 0; o < got.outputs.size(); ++o)
        for (size_t i = 0; i < got.outputs[o].size(); ++i) {
          const double d = std::abs(got.outputs[o][i] - alone[size_t(c)].outputs[o][i]);
          by = std::max(by, std::isnan(d) ? INFINITY : d);
        }
      if (!bitwise_equal(got, alone[size_t(c)])) ++moved_copies;
      if (by > furthest_by) furthest = std::move(got), furthest_by = by, *chosen = size_t(c);
    }
    mem.synchronize(load_stream);
    if (moved_copies > 0)
      *moved = std::to_string(moved_copies) + " of " + std::to_string(kConcurrentCopies) +
               " copies on " + std::to_string(kLoadStreams) +
               " streams under load differ bitwise from the same call run alone";
    return furthest;
  }

  // The tiled condition's call into `got` (false, with `r` saying why, where it did not run or
  // the kernel threw). Its memory is asked of the device before anything is allocated.
  bool run_tiled(const Condition& cond, const OpInputs& x, const OpShape& s, const OpRun& ref,
                 OpRun& got, ConditionResult& r, int& copy) const {
    r.shape = tiled_shape(s, cond.copies).text();
    try {
      check_backend_fits(opt.backend, tiled_call_bytes(op, variant, x, s, cond.copies),
                         "'" + cond.name + "'");
    } catch (const BackendError& e) {
      r.ran = false, r.note = std::string(e.what()) + ": not run";
      return false;
    }
    const KernelCallMarks marks = kernel_call_marks();  // staging and reading 4.3 G values: ours
    try {
      got = call_op_tiled(op, variant, x, s, cond.copies, ref, &copy, &marks);
      r.note = std::to_string(s.tokens()) + " rows of fresh values repeated " +
               std::to_string(cond.copies) + " times; copy " + std::to_string(copy) +
               " judged, the furthest from the reference";
    } catch (const OutOfMemory& e) {  // divlab's own arrays (or an adapter's), not the kernel's
      r.ran = false, r.note = std::string(e.what()) + ": not run";
      return false;
    } catch (const std::exception& e) {
      kernel_threw(r, e);
      return false;
    }
    return true;
  }

  // A draw's shape: the condition's, or the first thing its generator draws.
  static OpShape draw_shape(const Condition& cond, std::mt19937_64& gen) {
    return cond.random_shapes ? random_shape(gen) : cond.shape;
  }

  // One draw of `cond`: inputs from `draw_seed`, at `forced` when given (shrinking), else the
  // condition's (or a random) shape.
  ConditionResult draw(const Condition& cond, int64_t draw_index, uint64_t draw_seed, uint64_t seed,
                       const OpShape* forced) const {
    ConditionResult r;
    r.name = cond.name, r.draws = 1;
    std::mt19937_64 gen(draw_seed);
    OpShape s;
    OpInputs x;
    std::vector<TokenId> tokens;
    if (cond.from_trace) {
      const CapturedCall& call = trace_calls().calls.at(size_t(draw_index));
      s = call.shape, x = call.inputs;
      r.note = call.where + " in a step from the trace's weights: " + trace_calls().source;
    } else {
      s = forced ? *forced : draw_shape(cond, gen);
      tokens = make_tokens(cond.tokens, s, gen, draw_index, seed, streams, &r.note);
      if (tokens.empty()) {
        r.ran = false;
        r.shape = s.text();
        return r;
      }
      x = op_inputs(op, s, tokens, cond.values, gen);
      x.misaligned = cond.misaligned;
      // The scalars from a generator of their own, so a shrunk draw keeps the failing draw's.
      if (!cond.fixed_scalars) {
        std::mt19937_64 scalar_gen(draw_seed ^ kScalarStream);
        x.scalars = random_scalars(scalar_gen, cond.values);
      }
      x.scalars.with_gradient = !cond.loss_only;
    }
    r.shape = s.text();
    round_as_stored(x, s);
    OpRun got;
    int tiled_copy = 0;  // the tiled condition's judged copy
    std::string moved;
    if (cond.concurrent) {
      // Each copy its own inputs, so a copy that reads another's state shows as error.
      std::vector<OpInputs> inputs{x};
      while (inputs.size() < size_t(kConcurrentCopies)) {
        inputs.push_back(op_inputs(op, s, tokens, cond.values, gen));
        inputs.back().scalars = x.scalars;
        round_as_stored(inputs.back(), s);
      }
      kernel_calls_begin();
      try {
        size_t chosen = 0;
        got = run_under_load(inputs, s, &moved, &chosen);
        kernel_calls_end();
        x = std::move(inputs[chosen]);
      } catch (const std::exception& e) {
        kernel_threw(r, e);
        return r;
      }
    }
    std::vector<ArgSpec> written;
    MemoryGrowth growth;
    OpRun ref = call_op(op, reference, x, s, &written);
    if (cond.prefill) {
      // At the scale of the op's own contribution, in values both fp32 and bf16 hold exactly,
      // so the contribution can be measured against the pre-fill.
      bool any = false;
      for (size_t o = 0; o < written.size(); ++o) {
        if (written[o].role != ArgRole::Accumulate) continue;
        double ms = 0;
        for (double v : ref.outputs[o]) ms += v * v;
        const double rms = std::sqrt(ms / double(std::max<size_t>(1, ref.outputs[o].size())));
        std::normal_distribution<double> d(0.0, rms > 0 ? rms : 1.0);
        for (auto& v : x.outputs[o]) v = d(gen);
        round_to_bf16(x.outputs[o]);
        any = true;
      }
      if (!any) {
        r.ran = false, r.note = "the op adds into no output";
        return r;
      }
      ref = call_op(op, reference, x, s);
    }
    if (cond.earlier_calls > 0) {
      // Earlier calls on other values (other ids too) in the same arrays.
      OpInputs first = op_inputs(op, s, uniform_tokens(s, gen), cond.values, gen);
      first.scalars = x.scalars;
      round_as_stored(first, s);
      kernel_calls_begin();
      try {
        got = call_op_in_place_after(op, variant, first, cond.earlier_calls, x, s, &growth);
      } catch (const std::exception& e) {
        kernel_threw(r, e);
        return r;
      }
    } else if (cond.copies > 0) {
      if (!run_tiled(cond, x, s, ref, got, r, tiled_copy)) return r;
    } else if (!cond.concurrent) {
      const KernelCallMarks marks = kernel_call_marks();
      try {
        const OmpTeam team(cond.threads);
        got = call_op(op, variant, x, s, nullptr, &marks);
      } catch (const std::exception& e) {
        kernel_threw(r, e);
        return r;
      }
    }
    kernel_calls_end();  // (after the concurrent condition, a second mark: its calls ended above)
    // A trace's values can hold NaN too (an activation that overflowed): judged as planted ones.
    const bool nan_inputs =
        cond.values == Values::NaNs ||
        (cond.from_trace && std::any_of(x.values.begin(), x.values.end(), [](const auto& v) {
           return std::any_of(v.begin(), v.end(), [](double e) { return std::isnan(e); });
         }));
    const std::vector<std::vector<bool>> nans =
        nan_inputs ? nan_reach(op, reference, x, s) : std::vector<std::vector<bool>>{};
    // One call's outputs measured against the reference, in `into` (its name, draws, shape and
    // note kept).
    auto assess = [&](ConditionResult& into, const OpRun& out) {
      ConditionResult m;
      m.name = into.name, m.draws = into.draws, m.shape = into.shape, m.note = into.note;
      measure(m, out, ref, x.outputs, written, {}, nans);
      if (m.norm_error > kTolerance && !round_inputs) {
        // Past the bar: is it more than rounding the inputs to bf16 explains? (Computed only
        // here, so a passing draw costs one reference call.)
        const std::vector<double> allow =
            input_rounding_allowance(x, s, ref, written, round_to_bf16);
        ConditionResult again;
        again.name = m.name, again.draws = m.draws, again.shape = m.shape, again.note = m.note;
        measure(again, out, ref, x.outputs, written, allow, nans);
        m = std::move(again);
      }
      into = std::move(m);
    };
    assess(r, got);
    // (Also past 1e-2: such a draw passed only on the bf16 allowance above, and the fp32 grade
    // still asks whether fp32 arithmetic explains it.)
    if (required == Grade::Fp32 && !round_inputs && r.norm_error > kFp32Grade) {
      // Past the fp32 grade: is it more than the op's own conditioning explains? An fp32 kernel
      // computes on fp32 inputs, and at large values rounding them already moves the exact
      // result (attention at x1e3 values: scores near 1e6 carry errors near 0.1 in fp32); so
      // does an fp32 kernel's own arithmetic, as the backend's fp32 reference on the same inputs
      // shows (two nearly tied scores can swap which one the softmax picks). Twice the larger
      // of the two is accepted: an fp32 kernel is judged against what fp32 can do on this input.
      std::string worst;  // (the table names the worst element by the plain measure)
      r.fp32_grade_error =
          fp32_grade_error(x, s, cond.copies, ref, without_summed(got, ref), written, nans, &worst);
    }
    // The bf16 mode keeps the residual stream, weights and gradients in fp32, so an op's fp32
    // outputs there (an add's sum, a norm's statistics, a weight gradient) are fp32 arithmetic
    // on the inputs as stored: a kernel that rounds or sums them in bf16 stays within 1e-2.
    if (fp32_outputs)
      r.fp32_outputs_error =
          fp32_outputs_error(x, s, cond.copies, ref, got, written, nans, &r.fp32_outputs_worst);
    r.stray_writes = got.stray_writes;
    ConditionResult repeated;  // the repeat's own measure, where its outputs differ
    repeated.name = r.name, repeated.draws = r.draws, repeated.shape = r.shape;
    if (cond.repeat) {
      OpRun again;
      bool threw = false;
      const KernelCallMarks marks = kernel_call_marks();
      try {
        again = call_op(op, variant, x, s, nullptr, &marks);
      } catch (const std::exception& e) {
        r.note = std::string("threw on the repeat: ") + e.what(), threw = true;
      }
      kernel_calls_end();
      r.deterministic = bitwise_equal(got, again);
      if (!r.deterministic && r.note.empty()) r.note = "not bitwise repeatable";
      // Another order of sums may repeat differently; a wrong repeat may not: a result carried
      // between calls (a table built at the first call and kept in scratch, where a later call
      // may find a new region or another kernel's values), judged as the first call is.
      if (!r.deterministic && !threw) {
        assess(repeated, again);
        judge(repeated);
      }
    }
    judge(r);
    if (cond.judge_rows && !r.failed && r.row_error > kTolerance)
      r.failed = true,
      r.why = "row error " + format_e(r.row_error) + " > 1e-2 in " + r.worst_row +
              ": a row far below the tensor's largest computed far worse than its size allows "
              "(one scale, step or threshold for the whole tensor?)";
    if (repeated.failed && !r.failed) {
      repeated.stray_writes = r.stray_writes, repeated.deterministic = false;
      repeated.why =
          "the same call again, on the same inputs and in fresh scratch: " + repeated.why +
          " (a result carried over from an earlier call?)";
      r = std::move(repeated);
    }
    if (const std::string scalars = scalars_text(op, x.scalars);
        !r.worst.empty() && !scalars.empty())
      r.worst += " (" + scalars + ")";
    if (cond.copies > 0 && !r.worst.empty())  // where the judged copy sits in the call
      r.worst += "; in copy " + std::to_string(tiled_copy) + " of " + std::to_string(cond.copies) +
                 ", the call's rows from " + std::to_string(int64_t(tiled_copy) * s.tokens());
    if (cond.earlier_calls == 1 && r.failed)
      r.why +=
          " (after a first call on other values in the same arrays: kept by address? scratch "
          "read before it is written?)";
    if (cond.earlier_calls > 1 && r.failed)
      r.why += " (after " + std::to_string(cond.earlier_calls) +
               " calls on other values: a path taken after warm-up? state built up over calls?)";
    if (cond.threads > 0 && r.failed)
      r.why += " (in a team of " + std::to_string(cond.threads) +
               " OpenMP threads: work divided, or partial sums combined, by the team?)";
    if (const std::string leak = memory_leak_finding(growth); !leak.empty())
      r.failed = true, r.why = r.why.empty() ? leak : r.why + "; " + leak;
    if (!moved.empty()) {  // a race fails on its error; a varying order within it is noted
      if (r.failed)
        r.why += " (" + moved +
                 ": a race on shared scratch or device state, or work outside "
                 "the stream it is given)";
      else
        r.note = moved + " (within the criteria: an order that varies, not a race)";
    }
    return r;
  }

  // Every draw of `cond`; the first failing draw (shrunk) or else the worst one.
  ConditionResult run(const Condition& cond, size_t index, uint64_t seed) const {
    ConditionResult worst;
    bool deterministic = true;
    std::string note;
    double grade = 0, fp32_outputs = -1;
    std::string fp32_outputs_worst;
    const int draws = cond.from_trace   ? int(trace_calls().calls.size())
                      : cond.draws == 0 ? 1
                                        : cond.draws * opt.draws;
    for (int d = 0; d < draws; ++d) {
      const uint64_t draw_seed = mix64(seed ^ mix64(uint64_t(index) * 1000 + uint64_t(d) + 1));
      ConditionResult r = draw(cond, d, draw_seed, seed, nullptr);
      r.draws = d + 1;
      if (!r.ran) return r;
      if (r.failed) {
        if (cond.shrink) shrink(cond, d, draw_seed, seed, r);
        return r;
      }
      deterministic = deterministic && r.deterministic;
      if (note.empty()) note = r.note;
      grade = std::max(grade, r.grade_error());
      if (r.fp32_outputs_error > fp32_outputs)
        fp32_outputs = r.fp32_outputs_error, fp32_outputs_worst = r.fp32_outputs_worst;
      if (d == 0 || r.norm_error > worst.norm_error) worst = r;
    }
    worst.draws = draws, worst.deterministic = deterministic;
    if (!cond.from_trace) worst.note = note;  // a recorded call's note says which call it was
    worst.fp32_grade_error = grade;  // the worst draw by the grade's measure, maybe another
    worst.fp32_outputs_error = fp32_outputs, worst.fp32_outputs_worst = fp32_outputs_worst;
    return worst;
  }

  // Smaller shapes, one dimension at a time, while the draw still fails: the author's
  // reproducer.
  void shrink(const Condition& cond, int64_t draw_index, uint64_t draw_seed, uint64_t seed,
              ConditionResult& failed) const {
    std::mt19937_64 gen(draw_seed);
    OpShape now = draw_shape(cond, gen);  // the failing draw's
    ConditionResult smallest = failed;
    int tries = 0;
    for (bool progress = true; progress && tries < kShrinkTries;) {
      progress = false;
      for (const OpShape& s : smaller_shapes(now)) {
        if (++tries > kShrinkTries) break;
        ConditionResult r = draw(cond, draw_index, draw_seed, seed, &s);
        if (r.ran && r.failed) {
          now = s, smallest = r, progress = true;
          break;
        }
      }
    }
    if (smallest.shape != failed.shape)
      failed.smallest = smallest.shape + ": " + smallest.why +
                        (smallest.worst.empty() ? "" : "; worst " + smallest.worst);
  }

  // The benchmark's verifier as the report describes it: Gaussian inputs from one fixed seed,
  // the shapes it was written for, |v - r| <= 1e-2 + 1e-2 |r| on 99 % of the elements.
  bool benchmark_verifier() const {
    Condition cond;
    cond.name = "benchmark verifier", cond.fixed_scalars = true;
    for (const OpShape& s : verifier_shapes()) {
      const ConditionResult r = draw(cond, 0, 0, 0, &s);
      if (r.ran && (!r.finite || r.verifier_pass < 0.99)) return false;
    }
    return true;
  }

  // Why `cond` is skipped for this op and backend ("" where it runs).
  std::string why_not_run(const Condition& cond, Op which) const {
    if (!cond.applies_to(which)) return cond.not_for;
    if (cond.device_only && variant.memory->host_accessible)
      return std::string("a GPU condition (") + cond.device_only + "): --backend cuda";
    if (cond.threads > 0 && !variant.memory->host_accessible)
      return "a CPU condition (the host's OpenMP team does not divide a GPU kernel's work)";
    if (std::string short_of = host_memory_shortfall(cond, available_host_memory());
        !short_of.empty())
      return short_of;
    if (opt.shape_conditions_only && !cond.shapes_only)
      return "not in the racecheck pass (shape conditions only)";
    return "";
  }

  void run_all(CheckReport& rep, size_t from, const CheckProgress& progress) const {
    Op which{};
    parse_op(op, &which);
    const auto list = check_condition_list(!opt.trace.empty());
    rep.conditions.resize(list.size());
    this->progress = &progress;
    for (size_t i = from; i < list.size(); ++i) {
      const Condition& cond = list[i];
      if (!rep.conditions[i].selected) continue;  // left out by --condition
      if (progress.begin) progress.begin(i);
      ConditionResult r;
      if (const std::string why = why_not_run(cond, which); !why.empty()) {
        r.name = cond.name, r.shape = cond.shape.text(), r.ran = false, r.note = why;
      } else {
        r = run(cond, i, rep.seed);
      }
      if (progress.result) progress.result(i, r);
      rep.conditions[i] = std::move(r);
    }
    // The verifier's emulation belongs to the whole table: not run for a few conditions.
    if (!rep.selected.empty()) {
      rep.benchmark_verifier_passes = false;
      return;
    }
    if (progress.begin) progress.begin(list.size());
    rep.benchmark_verifier_passes = !opt.shape_conditions_only && benchmark_verifier();
    if (progress.verifier) progress.verifier(rep.benchmark_verifier_passes);
  }
};

}  // namespace

std::vector<ConditionInfo> check_conditions(const CheckOptions& opt) {
  std::vector<ConditionInfo> out;
  for (const Condition& c : check_condition_list(!opt.trace.empty()))
    out.push_back({c.name, c.random_shapes ? "random"
                           : c.from_trace  ? "recorded"
                                           : c.shape.text()});
  return out;
}

CheckReport new_check_report(const CheckOptions& opt) {
  const auto eq = opt.target.find('=');
  if (eq == std::string::npos)
    throw InputError("check '" + opt.target +
                     "': expected OP=VARIANT, e.g. "
                     "embed_rmsnorm_backward=bf16_accum");
  CheckReport rep;
  rep.op = opt.target.substr(0, eq), rep.variant = opt.target.substr(eq + 1);
  rep.backend = opt.backend;
  rep.precision = opt.precision;
  const auto& ops = checkable_ops();
  if (std::find(ops.begin(), ops.end(), rep.op) == ops.end()) {
    std::string list;
    for (const auto& o : ops) list += (list.empty() ? "" : ", ") + o;
    const std::string best = rep.op.empty() ? "" : closest_name(rep.op, ops);
    throw InputError("check '" + opt.target + "': no op '" + rep.op + "'" +
                     (best.empty() ? "" : " (did you mean '" + best + "'?)") + "; ops: " + list);
  }
  if (opt.precision == Precision::Fp64)
    throw InputError("check --precision fp64: the reference is fp64 already; fp32 or bf16");
  if (opt.draws < 1 || opt.draws > 100)
    throw InputError("check --draws " + std::to_string(opt.draws) + ": must be 1 to 100");
  // The bf16 grade where bf16 values are: an op without activations (the embedding's fp32
  // residual stream, the optimizer's updates) is the fp32 mode's, checked as there.
  const bool bf16 = bf16_values(opt.precision, rep.op);
  rep.required = bf16 ? Grade::Bf16 : opt.grade;
  rep.fp32_outputs_required = bf16 && opt.grade == Grade::Fp32;
  rep.seed = opt.seed ? opt.seed : std::random_device{}();
  if (!opt.trace.empty()) check_capture_source(opt.trace, rep.op);
  rep.trace = opt.trace, rep.plugins = opt.plugins;
  rep.draws = opt.draws, rep.grade_asked = opt.grade, rep.time_limit = opt.time_limit;
  const std::vector<Condition> list = check_condition_list(!opt.trace.empty());
  rep.conditions.resize(list.size());
  if (!opt.conditions.empty()) {
    rep.selected = select_conditions(opt.conditions, list);
    for (size_t i = 0; i < list.size(); ++i) {
      ConditionResult& r = rep.conditions[i];
      r.name = list[i].name, r.shape = list[i].shape.text();
      r.selected =
          std::find(rep.selected.begin(), rep.selected.end(), r.name) != rep.selected.end();
      r.ran = r.selected;
    }
  }
  return rep;
}

void run_check_conditions(const CheckOptions& opt, CheckReport& rep, size_t from,
                          const CheckProgress& progress) {
  try {
    load_plugins(opt.plugins);
  } catch (const PluginError& e) {
    throw InputError(std::string("--plugins: ") + e.what());
  }
#ifdef __GLIBC__
  // Every draw allocates and frees arrays of up to tens of MB. glibc hands blocks that large
  // back to the kernel at once (mmap), so each draw page-faults them in afresh, which cost more
  // than the arithmetic (2-3x the check's time on a 2-core VM). Keep blocks up to 256 MB in the
  // heap instead.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  const KernelSet<double> reference = cpu_catalogue<double>().select({});
  try {
    open_backend(opt.backend);
    with_backend_catalogue(opt.backend, opt.precision, [&](const auto& catalogue) {
      const auto variant = catalogue.select({{rep.op, rep.variant}});
      const auto backend_reference = catalogue.select({});
      rep.declared_control = catalogue.is_benign(rep.op, rep.variant);
      if (progress.control) progress.control(rep.declared_control);
      Checker<std::decay_t<decltype(variant)>> checker{opt,
                                                       rep.op,
                                                       reference,
                                                       variant,
                                                       backend_reference,
                                                       rep.required,
                                                       bf16_values(opt.precision, rep.op),
                                                       rep.fp32_outputs_required,
                                                       {},
                                                       {},
                                                       {},
                                                       {},
                                                       {}};
      checker.run_all(rep, from, progress);
    });
  } catch (const BackendError& e) {
    throw InputError(e.what());
  } catch (const UnknownKernel& e) {
    throw InputError(std::string("check: ") + e.what());
  }
}

void finish_check_report(CheckReport& rep) {
  rep.pass = true, rep.failing.clear();
  double worst = 0;
  for (const ConditionResult& r : rep.conditions) {
    if (!r.ran) continue;
    if (r.failed) rep.pass = false, rep.failing.push_back(r.name);
    if (!r.failed) worst = std::max(worst, r.grade_error());  // the grade of what passed
  }
  rep.grade = worst <= kFp32Grade ? Grade::Fp32 : Grade::Bf16;
  // Reduced-precision arithmetic inside an fp32 kernel is a failure of its own, named once:
  // such a kernel changes training even where every condition passes at 1e-2.
  if (rep.required == Grade::Fp32 && rep.grade != Grade::Fp32) {
    rep.pass = false;
    rep.failing.push_back(kFp32GradeCondition);
  }
  if (rep.fp32_outputs_required &&
      std::any_of(rep.conditions.begin(), rep.conditions.end(), [](const ConditionResult& r) {
        return r.ran && !r.failed && r.fp32_outputs_error > kFp32Grade;
      })) {
    rep.pass = false;
    rep.failing.push_back(kFp32OutputsCondition);
  }
}

CheckReport run_check(const CheckOptions& opt) {
  CheckReport rep = new_check_report(opt);
  run_check_conditions(opt, rep, 0, {});
  finish_check_report(rep);
  return rep;
}

}  // namespace divlab
