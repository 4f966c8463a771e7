// The inputs `divlab check` feeds one op, and the one way it calls any op on any kernel set.
//
// Shapes come fixed (documented, the same every run) and drawn at random on every run, biased
// toward the sizes that break tuned kernels (1, primes, one past a power of two, odd head
// widths), so a kernel exact only for a list of shapes cannot pass by luck. Values come at
// several scales and with outlier channels, as activations and logits have in training.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/guarded_workspace.h"
#include "kernels/harness.h"
#include "kernels/op_spec.h"

namespace divlab {

struct OpShape {
  int B = 1, T = 1, C = 1, NH = 1, V = 2;
  int kv_heads = 0;  // the grouped-query ops' key/value heads; 0: derived from NH (NKV())
  int64_t tokens() const { return int64_t(B) * T; }
  // Key/value heads of the grouped-query ops: kv_heads where set (a recorded call), else NH over
  // its smallest prime factor, so groups of 2 and 3 heads (and NKV = 1 for one to three heads)
  // occur; derived, so shapes draw as before.
  int NKV() const;
  std::string text() const;  // "B3 T37 C78 NH3 V301"
};

// A shape drawn at random: rows (B x T) from 1 to a few hundred, sequence lengths, widths and
// vocabularies biased toward 1, primes and one past or short of a power of two.
OpShape random_shape(std::mt19937_64& gen);

// The ops training calls on its parameters, gradients and optimizer state, which it keeps in flat
// buffers with the tensors packed without padding: at a width that is not a multiple of 8 values
// (bf16) or 4 (fp32) their arrays start off 16-byte boundaries (OpInputs::misaligned).
// Activations have buffers of their own, always aligned.
const std::vector<Op>& ops_on_packed_tensors();
// Smaller shapes to try when `s` fails (each one dimension smaller), for shrinking.
std::vector<OpShape> smaller_shapes(const OpShape& s);

enum class Values {
  Normal,    // N(0, 1)
  Tiny,      // x 1e-10: where an epsilon or a subnormal decides
  Large,     // x 1e3: where a missing max subtraction overflows
  ZeroRows,  // the first rows all zero
  Outliers,  // a few channels x 30 on top of N(0, 1), as in trained activations and logits
  NaNs,      // N(0, 1) with two values NaN, as a step that blew up leaves its activations
  Shifted,   // N(0, 1), each row moved by its own 1e2 to 1e3, up or down (logits far from 0)
  RowScales  // N(0, 1), each row times its own 10^u, u uniform in [-3, 3]
};

// Uniform token ids for `s`.
std::vector<TokenId> uniform_tokens(const OpShape& s, std::mt19937_64& gen);

// An op's inputs under a value condition, with the default scalars; the outputs it overwrites
// start as NaN (a kernel that reads one gives NaN), the ones it adds into zeroed (the caller may
// pre-fill them). Activation inputs take the value condition; weights keep their scale; rstd and
// attention probabilities are derived from the inputs in fp64, so backward ops see a consistent
// forward.
OpInputs op_inputs(const std::string& op, const OpShape& s, const std::vector<TokenId>& ids,
                   Values values, std::mt19937_64& gen);

// Scalar arguments drawn at random from the ranges training uses (eps 1e-7 to 1e-4, a soft-cap
// of 5 to 100, RoPE bases 1e3 to 1e6, SGD with momentum and weight decay each off or on, ...),
// so a kernel that hard-codes the value it was tested with fails. `values`: the inputs' value
// condition (some scalars would leave nothing to judge under one).
OpScalars random_scalars(std::mt19937_64& gen, Values values = Values::Normal);
// The scalars `op` takes, as a report names them ("cap 15, eps 1e-06"; "" for an op with none).
std::string scalars_text(const std::string& op, const OpScalars& c);

// The shape and scalars at which call_op repeats a recorded call of `op` whose size and scalar
// arguments were `values` (in argument order).
OpShape shape_of_call(const std::string& op, const std::vector<double>& values);
OpScalars scalars_of_call(const std::string& op, const std::vector<double>& values);

// The probabilities the fp64 reference attention forward saves for `qkv` at `s`: the saved
// input attention_backward is checked with (each backend's backward reads its own forward's).
std::vector<double> reference_attention_state(const std::vector<double>& qkv, const OpShape& s);

// Marks around the kernel's own work inside call_op: `begin` once its arrays are staged, `end`
// once its work is done (the device's stream waited for), before its outputs are read back. A
// clock that times a kernel between them does not count divlab staging or reading millions of
// values on a busy host.
struct KernelCallMarks {
  std::function<void()> begin, end;
};

// Runs `op` of `k` on `x` at shape `s`; `written`, when given, receives the op spec of every
// array the call writes, in the order of x.outputs (kernels/op_spec.h).
template <class KS>
OpRun call_op(const std::string& op, const KS& k, const OpInputs& x, const OpShape& s,
              std::vector<ArgSpec>* written = nullptr, const KernelCallMarks* marks = nullptr);

// Which of `x`'s arrays `k`'s kernel for `op` takes in the activations' storage (bf16 in the
// bf16 mode): its inputs in the order of x.values, its outputs in the order of x.outputs; the
// others are T (fp32 there: the residual stream, weights, gradients). Nothing is called.
struct ActivationStorage {
  std::vector<bool> inputs, outputs;
};
template <class KS>
ActivationStorage activation_storage(const std::string& op, const KS& k, const OpInputs& x,
                                     const OpShape& s);

// Runs `op` of `k` once at `s` with every array that grows with the rows repeated `copies` times
// (B x copies sequences of `x`'s values; kernels/tiled_arrays.h), so that arrays past any size
// the host could hold in doubles need only the base call's fp64 reference, `expect`. Returns
// the copy whose outputs lie furthest from `expect` (its index in `chosen`), an output summed
// over the rows (a weight's gradient) as the base call's share of the sum, and every write
// outside the arrays. `marks`, when given, mark the kernel's call as call_op's do: after the
// copies are staged, and once the call has finished, before they are read and compared.
template <class KS>
OpRun call_op_tiled(const std::string& op, const KS& k, const OpInputs& x, const OpShape& s,
                    int copies, const OpRun& expect, int* chosen = nullptr,
                    const KernelCallMarks* marks = nullptr);
// `s` with `copies` times its sequences: the shape call_op_tiled calls the kernel at.
OpShape tiled_shape(const OpShape& s, int copies);
// The bytes of k's memory that call takes (with an adapter's copies of its arrays, at most).
template <class KS>
size_t tiled_call_bytes(const std::string& op, const KS& k, const OpInputs& x, const OpShape& s,
                        int copies);

// Runs `op` of `k` `earlier` times on `first`, then on `x`, all in the same arrays (refilled in
// place, as training's buffers are every step): a kernel that keeps anything by address from one
// call to the next (a weight prepared once per pointer) computes with stale values, and one that
// changes with its call count (an algorithm switched after warm-up, a counter) shows it. The
// outputs of the last call.
// With `leak`: how the memory in use grew from call kLeakFrom to the last earlier call, host heap
// and device, for a kernel that allocates at every call and never releases. The device's reading
// counts every process on it, so its growth is taken per quarter of the calls, less what it grew
// while waiting as long as the quarter's calls took right after them: a kernel that leaks grows
// it in every quarter's calls, another process's allocations in one or two, or while waiting too.
struct MemoryGrowth {
  int64_t host = 0, device = 0;                           // bytes; `device` net of the waits
  std::array<int64_t, 4> device_quarters = {0, 0, 0, 0};  // bytes of `device`, quarter by quarter
  int calls = 0;                                          // between the two readings
};
constexpr int kLeakFrom = 16;  // first calls may build caches and grow scratch once
template <class KS>
OpRun call_op_in_place_after(const std::string& op, const KS& k, const OpInputs& first, int earlier,
                             const OpInputs& x, const OpShape& s, MemoryGrowth* leak = nullptr);

// One call of `op` with its arrays bound in k's memory once, to be launched on a stream of one's
// choosing without waiting (several on several streams run at once: check's concurrent-load
// condition) and read afterwards. Each has its own scratch workspace and the seed of a first
// call, so copies of one call compute the same thing.
template <class KS>
class PreparedCall {
 public:
  PreparedCall(const std::string& op, const KS& k, OpInputs x, const OpShape& s);
  PreparedCall(const PreparedCall&) = delete;  // the bound arrays point into x_
  PreparedCall& operator=(const PreparedCall&) = delete;
  void launch(void* stream);  // queues the call on `stream` (null: the legacy default stream)
  void reset();               // outputs back to their initial contents
  // Inputs poisoned now; the next launch_staged queues their values on its stream first, as
  // training writes an op's inputs on its stream right before the call (BoundArray::poison).
  void poison_inputs() { arrays_.poison_inputs(); }
  void launch_staged(void* stream) {
    arrays_.restore_inputs_on(stream);
    launch(stream);
  }
  OpRun read();  // waits for the last launch's stream; the outputs

 private:
  Op op_;
  const KS& k_;
  OpInputs x_;
  OpShape s_;
  BoundCall arrays_;
  GuardedContexts contexts_;  // a plug-in's scratch guarded
  void* stream_ = nullptr;
};

// Rounds every value to the nearest bf16 (so a bf16 kernel and the fp64 reference see the same
// numbers).
void round_to_bf16(std::vector<double>& v);
// The same to the nearest fp32 (what an fp32 kernel sees, and holds).
void round_to_fp32(std::vector<double>& v);

}  // namespace divlab
