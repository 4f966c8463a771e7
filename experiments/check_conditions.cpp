#include "experiments/check_conditions.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <initializer_list>

#include "common/errors.h"
#include "experiments/config.h"

namespace divlab {

namespace {
// 8192 tokens over 8192 ids: uniform rows get ~1 addition, Zipf(1.1)'s top row ~900, Brown's
// ("the") ~500, each position row 8: the dose at which bf16 accumulation breaks on hot rows and
// rounding alone does not. Used by the ops that gather or scatter by token id.
constexpr OpShape kDose{8, 1024, 64, 4, 8192};
// 303 tokens over 211 ids, every id present but one in seven: rows that must be updated and rows
// that must not, both at the ends of the table.
constexpr OpShape kRows{3, 101, 24, 2, 211};
constexpr OpShape kTiny{1, 1, 4, 1, 5};
// 111 rows of 78 channels in 3 heads of 26 (RoPE needs an even head width), 301 ids: no size a
// multiple of 4, 8, 32 or 128 (a vector body without its tail, a tile of 32 rows or channels).
constexpr OpShape kOdd{3, 37, 78, 3, 301};
constexpr OpShape kAligned{4, 64, 128, 4, 512};
constexpr OpShape kLarge{8, 256, 256, 4, 2048};
// Sizes past the ones kernels are written for. A vocabulary past 2^17 (Llama 3 has 128 256 ids,
// GPT-2 50 304): ids that a 16-bit index wraps, rows wider than a block's shared memory, a grid
// dimension past 65 535.
constexpr OpShape kWideVocabulary{2, 8, 16, 1, 131101};
// A sequence past 2048 positions: a RoPE table, an attention tile or a position count written
// for GPT-2's 1024 or a model's 2048.
constexpr OpShape kLongSequence{1, 2051, 32, 2, 97};
// More rows than a grid dimension other than x holds (65 535): one block per row along y works
// at every other condition's size, and at a step of 65 536 tokens no longer (the lab's real-text
// doses are 65 536 to 262 144 tokens a step).
constexpr OpShape kManyRows{35, 2003, 8, 1, 16};  // 70 105 rows
// Rows wider than the ones kernels are written for: 4224 channels, past a row of 4096 values kept
// in a block's shared memory and past 1024 threads of one value each (Llama 2 7B has 4096, 70B
// 8192), in 33 heads of 128 channels, the head width of the llama family (GPT-2's is 64, where
// every other condition's heads stop).
constexpr OpShape kWideRows{2, 9, 4224, 33, 97};
// Heads twice the llama family's width: 256 channels a head (Gemma 2's, the model whose logits
// the soft-cap is from), past a head kept in 128 registers or a tile written for head sizes of 64
// and 128 (cuDNN's fused attention stops at 128: divlab's GPU reference then takes its GEMMs).
constexpr OpShape kWideHeads{2, 67, 512, 2, 97};
// More values in one array than any other condition's (4.19 M: 4094 rows of 1024, and logits of
// 1024 ids; the others stop near 560 000): a kernel with a path of its own for large tensors (a
// grid-stride loop, a split reduction, a vectorised or lossy fast path chosen past 2^20 values)
// runs that path in every real step (GPT-2 small's MLP holds 50 M activations a step, its logits
// 824 M) and in no other condition. 2047 positions: 2047 x 2^11 values, so a path in chunks of
// 2^12 values or more has a last, partial one. Larger costs more than the rest of a check
// together: at 33.5 M values 5-9 s and 2.3-3.4 GB more (measured), against 0.3-2 s.
constexpr OpShape kManyValues{2, 2047, 1024, 8, 1024};
// A flat array past 2^24 values (16 779 246: 2 x 8201 x 1023, and logits of 1023 ids): past a
// one-dimensional grid capped at 65 535 blocks of 256 threads (a kernel that caps its grid and
// has no grid-stride loop never touches the rest), past the integers fp32 holds exactly (an
// index computed in float), and no multiple of four (a large-array path with a vector body and
// no tail; every other large condition's count is a multiple of 2^11). GPT-2 small's MLP
// activations hold 50 M values a step, its parameters 124 M. Flat ops only (their cost grows with
// the array): 1.4-3.3 s and 0.7-1.6 GB of host memory more a check on an H200 machine (the
// inputs' normal draws take most of it), 0.5-3.9 s and 0.7-1.7 GB more on a 2-core CPU.
constexpr OpShape kPastGrid{2, 8201, 1023, 1, 1023};
// Logits past 2^32 values (4 295 961 600: 85 400 rows of GPT-2's 50 304 ids), as 61 rows of fresh
// values repeated 1400 times: an index or a count kept in 32 bits (int: past 2^31; unsigned:
// past 2^32) wraps in the last rows, which a step of GPT-2's vocabulary reaches at 42 700 tokens
// (signed) and 85 400 (unsigned), inside the lab's doses (65 536 to 262 144 tokens a step; 4 M
// in micro-batches of 262 144). Only the logits' ops have arrays that large in training.
// More (sequence, head) pairs than a grid dimension other than x holds (65 540 of 65 535): one
// block per pair along y (or per sequence along y and per head along z) works at every other
// condition's size, where B x NH stops at 280, and fails at a micro-batch of short sequences
// with many heads (4096 sequences of 64 tokens in 16 heads: 65 536 pairs). 3 positions, heads of
// 8 channels: 4.7 M values of qkv, cheap everywhere.
constexpr OpShape kManyHeads{16385, 3, 32, 4, 97};
// A sequence past 16 384 positions, for the ops that see positions without attention's T^2: a
// RoPE table or a position count written for 4096 (Llama 2) or 8192 (Llama 3) passes "sequence
// long" and fails here. 0.5 M values.
constexpr OpShape kLongerSequence{1, 16411, 16, 2, 97};
constexpr OpShape kTiledLogits{1, 61, 32, 1, 50304};
constexpr int kTiledLogitsCopies = 1400;

std::vector<Op> every_op_but(std::initializer_list<Op> skipped) {
  std::vector<Op> ops;
  for (int i = 0; i < kOpCount; ++i)
    if (std::find(skipped.begin(), skipped.end(), Op(i)) == skipped.end()) ops.push_back(Op(i));
  return ops;
}
}  // namespace

std::vector<Condition> check_condition_list(bool with_trace) {
  auto c = [](std::string name, OpShape s) {
    Condition k;
    k.name = std::move(name), k.shape = s;
    return k;
  };
  // A size past the ones kernels are written for: one draw, shrunk when it fails, for the ops
  // that have that dimension.
  auto past = [&c](std::string name, OpShape s, std::vector<Op> ops, const char* not_for) {
    Condition k = c(std::move(name), s);
    k.draws = 0, k.shrink = true, k.only = std::move(ops), k.not_for = not_for;
    return k;
  };
  std::vector<Condition> list;
  for (const auto& [name, tokens] :
       std::vector<std::pair<std::string, std::string>>{{"tokens uniform", "uniform"},
                                                        {"tokens zipf:1.1", "zipf:1.1"},
                                                        {"tokens text (Brown)", "brown"},
                                                        {"rows: ids absent", "rows"}}) {
    Condition k = c(name, tokens == "rows" ? kRows : kDose);
    k.tokens = tokens, k.only = {Op::embedding_forward, Op::embed_rmsnorm_backward};
    k.not_for = "the op does not gather or scatter by token id";
    list.push_back(k);
  }
  for (const auto& [name, s] : std::vector<std::pair<std::string, OpShape>>{
           {"shape tiny", kTiny}, {"shape odd", kOdd}, {"shape aligned", kAligned}}) {
    Condition k = c(name, s);
    k.shrink = true, k.shapes_only = true;
    list.push_back(k);
  }
  Condition large = c("shape large", kLarge);
  large.draws = 0, large.shapes_only = true;
  list.push_back(large);
  Condition random = c("shapes random", kTiny);
  random.random_shapes = true, random.shrink = true, random.draws = 3, random.shapes_only = true;
  list.push_back(random);
  for (const auto& [name, v] :
       std::vector<std::pair<std::string, Values>>{{"values tiny (x1e-10)", Values::Tiny},
                                                   {"values large (x1e3)", Values::Large},
                                                   {"values zero rows", Values::ZeroRows},
                                                   {"values outliers (x30)", Values::Outliers}}) {
    Condition k = c(name, kAligned);
    k.values = v, k.shrink = true;
    list.push_back(k);
  }
  Condition pre = c("accumulate pre-filled", kAligned);
  pre.prefill = true, pre.shrink = true;
  list.push_back(pre);
  // Training refills the same buffers every step: a kernel that keeps anything by address (a
  // weight prepared once per pointer) computes the second call with the first's values.
  Condition reused = c("arrays refilled", kAligned);
  reused.earlier_calls = 1, reused.shrink = true;
  list.push_back(reused);
  Condition rep = c("repeat (bitwise)", kAligned);
  rep.repeat = true;
  list.push_back(rep);
  Condition load = c("concurrent load", kAligned);
  load.concurrent = true, load.device_only = "streams";
  list.push_back(load);
  // Appended after the older conditions, so that a seed still replays their draws.
  list.push_back(
      past("vocabulary wide", kWideVocabulary,
           {Op::embedding_forward, Op::linear_forward, Op::linear_backward, Op::cross_entropy,
            Op::softcap_forward, Op::softcap_backward, Op::embed_rmsnorm_backward},
           "the op has no vocabulary dimension"));
  list.push_back(past("sequence long", kLongSequence,
                      {Op::embedding_forward, Op::attention_forward, Op::attention_backward,
                       Op::rope_forward, Op::rope_backward, Op::embed_rmsnorm_backward},
                      "the op sees positions only as rows"));
  list.push_back(past("rows many", kManyRows,
                      every_op_but({Op::attention_forward, Op::attention_backward}),
                      "attention's T^2 scores at 2003 positions (see 'sequence long')"));
  // One id at 67 914 or more of 70 105 positions: a row taking more contributions than 16 bits
  // count (a real-text step of 262 144 tokens gives "the" about 16 000; a 16-bit segment length or
  // count in a sorted scatter wraps past 65 535 and drops the rest).
  Condition hot = c("row hot (2^16+)", kManyRows);
  hot.tokens = "hot", hot.draws = 0;
  hot.only = {Op::embedding_forward, Op::embed_rmsnorm_backward};
  hot.not_for = "the op does not gather or scatter by token id";
  // A kernel that changes with its call count (an autotuner switching algorithms after warm-up,
  // a cache filled after N calls, a counter that wraps) passes every condition of a few calls
  // and changes mid-run: judged at the 257th call, as a run's fifth step at the latest.
  Condition warmed = c("call 257 (warmed up)", kAligned);
  warmed.earlier_calls = 256, warmed.draws = 0;
  Condition nans = c("values NaN", kAligned);
  nans.values = Values::NaNs, nans.shrink = true;
  nans.only = every_op_but({Op::embedding_forward});  // every op with activations as inputs
  nans.not_for = "the op's inputs are parameters and ids (no activation to carry a NaN)";
  list.push_back(nans);
  list.push_back(hot);
  list.push_back(warmed);
  // The trainer's flat parameter, gradient and optimizer buffers pack tensors without padding, so
  // a width that is not a multiple of 8 values (bf16) or 4 (fp32) starts the next tensor off a
  // 16-byte boundary: a kernel that loads 16 bytes at a time without looking crashes there
  // (every other condition's arrays start aligned). The aligned shape, so only the start is off.
  Condition misaligned = c("arrays misaligned", kAligned);
  misaligned.misaligned = true, misaligned.shrink = true;
  misaligned.only = ops_on_packed_tensors();
  misaligned.not_for = "training gives the op's arrays buffers of their own (aligned)";
  list.push_back(misaligned);
  list.push_back(
      past("channels wide", kWideRows,
           {Op::embedding_forward, Op::rmsnorm_forward, Op::rmsnorm_backward, Op::linear_forward,
            Op::linear_backward, Op::attention_forward, Op::attention_backward, Op::rope_forward,
            Op::rope_backward, Op::gqa_forward, Op::gqa_backward, Op::swiglu_forward,
            Op::swiglu_backward, Op::add_rmsnorm_forward, Op::embed_rmsnorm_backward},
           "the op sees its values as one flat vector, or rows of the vocabulary"));
  // Evaluation calls the cross-entropy for its losses alone (no dlogits): a path of its own in a
  // fused kernel, which every other condition leaves untried (one that writes the gradient
  // anyway crashes in a run's first evaluation; one whose loss-only path differs reports
  // validation losses the run never had).
  Condition loss_only = c("loss only (evaluation)", kAligned);
  loss_only.loss_only = true, loss_only.shrink = true;
  loss_only.only = {Op::cross_entropy};
  loss_only.not_for = "only the cross-entropy has a loss-only call";
  list.push_back(loss_only);
  Condition many_values = c("arrays large (4 M)", kManyValues);
  // Not shrunk: each step of a shrink reruns millions of values (a scatter that skips a row,
  // failing everywhere, took 56 s more to shrink here than its whole check took before).
  many_values.draws = 0, many_values.host_bytes = size_t(1) << 30;  // 0.75 GB on a CPU
  many_values.only = every_op_but({Op::linear_forward, Op::linear_backward, Op::attention_forward,
                                   Op::attention_backward, Op::rope_forward, Op::rope_backward,
                                   Op::gqa_forward, Op::gqa_backward});
  many_values.not_for =
      "its work grows faster than its arrays (a GEMM; attention's T^2) or its arrays triple "
      "here (RoPE's and GQA's heads): 'rows many' is its largest";
  list.push_back(many_values);
  Condition past_grid = c("arrays past 2^24", kPastGrid);
  past_grid.draws = 0;
  past_grid.host_bytes = size_t(3) << 30;  // 2.8 GB, AdamW's, the CUDA context included
  past_grid.only = {Op::add,         Op::gelu_forward,    Op::gelu_backward,
                    Op::cast,        Op::softcap_forward, Op::softcap_backward,
                    Op::sum_squares, Op::sgd_step,        Op::adamw_step};
  past_grid.not_for = "the op is not one flat array ('arrays large' is its largest)";
  list.push_back(past_grid);
  const std::vector<Op> head_ops = {Op::attention_forward, Op::attention_backward,
                                    Op::rope_forward,      Op::rope_backward,
                                    Op::gqa_forward,       Op::gqa_backward};
  list.push_back(past("heads wide (256)", kWideHeads, head_ops, "the op does not see heads"));
  // A softmax is the same for a row moved by any constant, and a row of logits need not sit near
  // 0 (a model's logits drift together as it trains, and as it diverges). Every other
  // condition's rows have their largest value near their spread, so a running max started at 0
  // instead of -inf, or one max for the whole batch, passes them; here exp of a row far below
  // that max underflows to 0: an infinite loss, NaN gradients.
  Condition shifted = c("rows offset (1e2-1e3)", kAligned);
  shifted.values = Values::Shifted, shifted.shrink = true;
  shifted.only = {Op::cross_entropy};
  shifted.not_for = "only the cross-entropy's math is the same for rows moved by a constant";
  list.push_back(shifted);
  // Rows of one tensor six decades apart, as trained activations have them (a first position's
  // "massive activations", 100-1000x the others'). Every other condition scales a whole tensor
  // at once, so a kernel with one scale, step or threshold for the whole tensor (16-bit fixed
  // point with a per-tensor scale, a per-tensor amax, a threshold relative to the largest value)
  // passes them, and loses its small rows here while the output's largest error stays small
  // next to its largest value: every row is judged against its own size. The ops whose rows
  // keep their size (not the softmaxes and soft-caps, whose saturated rows cancel to nothing in
  // fp32: there every kernel is far from fp64 row by row).
  Condition scaled = c("rows scaled 1e-3..1e3", kAligned);
  scaled.values = Values::RowScales, scaled.shrink = true, scaled.judge_rows = true;
  scaled.only = every_op_but({Op::embedding_forward, Op::attention_forward, Op::attention_backward,
                              Op::cross_entropy, Op::softcap_forward, Op::softcap_backward});
  scaled.not_for =
      "the op's rows do not keep their size: a softmax or soft-cap saturates (or no activation "
      "input)";
  list.push_back(scaled);
  Condition wide = c("logits past 2^32", kTiledLogits);
  wide.copies = kTiledLogitsCopies, wide.draws = 0;
  wide.device_only = "memory for 4.3 G values";
  wide.only = {Op::cross_entropy, Op::softcap_forward, Op::softcap_backward, Op::linear_forward,
               Op::linear_backward};
  wide.not_for = "the op has no array the size of a step's logits";
  list.push_back(wide);
  list.push_back(past("heads many (2^16+)", kManyHeads, head_ops, "the op does not see heads"));
  list.push_back(
      past("sequence 2^14+", kLongerSequence,
           {Op::embedding_forward, Op::rope_forward, Op::rope_backward, Op::embed_rmsnorm_backward},
           "the op sees positions only as rows (attention: 'sequence long')"));
  // The OpenMP team a CPU kernel runs in is the run's `train.threads`: every core by default, one
  // in a sweep with as many cells at a time as cores, and whatever OMP_NUM_THREADS the machine
  // checking the kernel had. A kernel that divides its work or combines its partial sums by
  // the team (a tree over a power-of-two team, a table of partials for 32 threads, a remainder
  // left to a thread that one thread never has) is right on the machine it was written on
  // and wrong on another. One thread, an odd team, and a team past 64, at the odd shape (111
  // rows: every thread of 67 has one or two; 9 sequence-head pairs, so most of a team over
  // those idles), each judged as any draw.
  for (int team : {1, 3, 67}) {
    Condition k = c("OpenMP threads " + std::to_string(team), kOdd);
    k.shrink = true, k.threads = team;
    list.push_back(k);
  }
  if (with_trace) {
    Condition traced = c("values from trace", kTiny);
    traced.from_trace = true;
    list.push_back(traced);
  }
  return list;
}

std::vector<std::string> select_conditions(const std::vector<std::string>& asked,
                                           const std::vector<Condition>& list) {
  auto lower = [](std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  std::vector<bool> chosen(list.size(), false);
  for (const std::string& name : asked) {
    const auto at = std::find_if(list.begin(), list.end(),
                                 [&](const Condition& c) { return lower(c.name) == lower(name); });
    if (at != list.end()) {
      chosen[size_t(at - list.begin())] = true;
      continue;
    }
    if (lower(name) == "values from trace")
      throw InputError("check --condition '" + name +
                       "': only with --trace (the run whose recorded values it judges)");
    std::vector<std::string> names, lowered;
    for (const Condition& c : list) names.push_back(c.name), lowered.push_back(lower(c.name));
    const std::string best = closest_name(lower(name), lowered);
    std::string all;
    for (const std::string& n : names) all += (all.empty() ? "'" : ", '") + n + "'";
    const auto best_at = std::find(lowered.begin(), lowered.end(), best);
    throw InputError("check --condition '" + name + "': no such condition" +
                     (best.empty()
                          ? ""
                          : " (did you mean '" + names[size_t(best_at - lowered.begin())] + "'?)") +
                     "; conditions: " + all);
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < list.size(); ++i)
    if (chosen[i]) out.push_back(list[i].name);
  return out;
}

std::string host_memory_shortfall(const Condition& cond, size_t available) {
  if (cond.host_bytes == 0 || available == 0 || available >= cond.host_bytes) return "";
  char text[160];
  std::snprintf(text, sizeof text,
                "needs about %.1f GiB of host memory, %.1f GiB available: not run",
                double(cond.host_bytes) / double(1 << 30), double(available) / double(1 << 30));
  return text;
}

std::vector<OpShape> verifier_shapes() {
  return {kAligned, kLarge};
}

}  // namespace divlab
