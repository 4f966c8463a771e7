// Running one op call on any backend from host inputs, with guard regions around every array:
// what `divlab check` and the GPU tests use to compare a kernel against the fp64 reference
// (ggml's test-backend-ops idea: same inputs everywhere, one error measure, stray writes caught:
// past an output's ends, and anywhere in an array the op only reads, which training still needs
// after the call: a forward's input is its backward's).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common/lowp.h"
#include "kernels/registry.h"

namespace divlab {

// The scalar arguments of an op call (those of ops that take any). The defaults are a step in
// the middle of training: momentum on with Nesterov, weight decay, a clipping scale below 1,
// AdamW's bias correction at step 7, llama 3's RoPE base, Gemma 2's cap on final logits.
struct OpScalars {
  double eps = 1e-5;       // rmsnorm_forward, add_rmsnorm_forward
  double dloss_scale = 1;  // cross_entropy: dloss = dloss_scale / N
  double lr = 0.1, momentum = 0.9, weight_decay = 0.01, grad_scale = 0.5;  // sgd_step
  bool nesterov = true;                                                    // sgd_step
  double adam_lr = 1e-3, beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8, adam_weight_decay = 0.1;
  int64_t step = 7;           // adamw_step (its grad_scale is grad_scale)
  double rope_base = 500000;  // rope_forward, rope_backward
  double softcap = 30;        // softcap_forward, softcap_backward
  // cross_entropy: false passes no dlogits (null), as evaluation's loss-only call does; the
  // gradient output is then left as it was and never compared.
  bool with_gradient = true;
};

struct OpInputs {
  std::vector<std::vector<double>> values;   // the op's float tensors, in signature order
  std::vector<TokenId> ids;                  // token ids or targets
  std::vector<std::vector<double>> outputs;  // initial contents of every output
  OpScalars scalars{};
  // Every array (the ids too) one value past a 16-byte boundary: the trainer packs its tensors
  // without padding, so at some widths its arrays start at any value's offset.
  bool misaligned = false;
};

struct OpRun {
  std::vector<std::vector<double>> outputs;
  std::vector<std::string> stray_writes;  // "output 1: write past its end", "input 0: ...", ...
  // A tiled call's (call_op_tiled): which outputs sum every copy's rows (given as the base rows'
  // share); empty for any other call.
  std::vector<bool> summed;
};

constexpr int64_t kGuardValues = 1024;  // values before and after every array (an aligned start)
constexpr float kGuardSentinel = -12345.678f;

// `live` filled with `poison` now; `pristine` (made in the same memory on first use) takes
// `initial`, which restore_buffer queues back into `live` on a stream.
template <class T>
void poison_buffer(const MemoryOps& mem, Buffer<T>& live, Buffer<T>& pristine,
                   const std::vector<T>& initial, T poison) {
  if (!pristine.size()) pristine = Buffer<T>(mem, live.size());
  pristine.upload(initial.data(), pristine.size());
  const std::vector<T> filled(size_t(live.size()), poison);
  live.upload(filled.data(), live.size());
}
template <class T>
void restore_buffer(const MemoryOps& mem, void* stream, Buffer<T>& live,
                    const Buffer<T>& pristine) {
  mem.copy(stream, live.data(), pristine.data(), sizeof(T) * size_t(live.size()));
}

// One of an op call's tensors, given as doubles and bound to the backend's memory in whatever
// storage type the kernel's parameter asks for (T or the activation type A: the conversion
// operator sees the parameter's type), with guard regions around it.
class BoundArray {
 public:
  BoundArray(const MemoryOps& mem, const std::vector<double>& values, int64_t guard)
      : mem_(&mem), values_(&values), guard_(guard) {}
  template <class V>
  operator V*() {
    return bind<std::remove_const_t<V>>();
  }
  bool bound() const { return !bytes_.empty(); }
  const std::vector<double>& initial_values() const { return *values_; }
  // Puts the initial contents (guards included) back, for another call on the same arrays.
  void rewrite() {
    if (bound()) bytes_.upload(initial_.data(), int64_t(initial_.size()));
  }
  // Poison now, the initial contents again once `stream` reaches this point: an input as training
  // gives it, written on the op's stream just before the call. A kernel whose work is not ordered
  // on the stream it is given reads NaN (all-ones bytes). The poison is written at once (call it
  // before queuing anything the host must not wait for); the restore is queued on the stream.
  void poison() {
    if (bound()) poison_buffer(*mem_, bytes_, pristine_, initial_, (unsigned char)0xFF);
  }
  void restore_on(void* stream) {
    if (bound()) restore_buffer(*mem_, stream, bytes_, pristine_);
  }
  // New contents of the same size in the same memory, as training refills a buffer each step.
  void refill(const std::vector<double>& values) {
    if (values.size() != values_->size())
      throw std::logic_error("run_op: refilled with another size");
    values_ = &values;
    if (!bound()) return;
    if (type_ == Storage::F32)
      encode<float>();
    else if (type_ == Storage::F64)
      encode<double>();
    else
      encode<bf16>();
    rewrite();
  }
  // What the call left: the values (guards excluded), widened, and whether a guard value
  // changed before or after them. One download.
  struct Result {
    std::vector<double> values;
    bool before_changed = false, after_changed = false;
  };
  Result read() const {
    if (!bound()) throw std::logic_error("run_op: an output the call never passed to its kernel");
    const std::vector<unsigned char> host = bytes_.to_vector();
    const int64_t n = int64_t(values_->size());
    Result r;
    r.values.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) r.values[i] = stored_value(host.data(), type_, guard_ + i);
    for (int64_t g = 0; g < guard_; ++g) {
      r.before_changed |= !(stored_value(host.data(), type_, g) == sentinel_);
      r.after_changed |= !(stored_value(host.data(), type_, guard_ + n + g) == sentinel_);
    }
    return r;
  }
  // For an array the call only reads: where it changed, if it did ("" if not). One download.
  std::string change() const {
    return bound() ? first_change(bytes_.to_vector(), initial_, int64_t(values_->size()), guard_)
                   : "";
  }
  // Where `now` (an array of n values between two guards of `guard`, as bytes) first differs
  // from `before`, in words ("" if nowhere).
  static std::string first_change(const std::vector<unsigned char>& now,
                                  const std::vector<unsigned char>& before, int64_t n,
                                  int64_t guard) {
    const size_t width = now.size() / size_t(n + 2 * guard);
    for (size_t b = 0; b < now.size(); ++b)
      if (now[b] != before[b]) {
        const int64_t i = int64_t(b / width) - guard;
        return i < 0    ? "write before its start"
               : i >= n ? "write past its end"
                        : "written at value " + std::to_string(i);
      }
    return "";
  }

 private:
  // initial_: the values in V between two guards of the sentinel.
  template <class V>
  void encode() {
    std::vector<V> host(values_->size() + 2 * size_t(guard_), stored_as<V>(kGuardSentinel));
    for (size_t i = 0; i < values_->size(); ++i)
      host[size_t(guard_) + i] = stored_as<V>((*values_)[i]);
    const auto* first = reinterpret_cast<const unsigned char*>(host.data());
    initial_.assign(first, first + host.size() * sizeof(V));
  }
  template <class V>
  V* bind() {
    if (bound()) {
      if (type_ != storage_of<V>())
        throw std::logic_error("run_op: one tensor passed as two storage types");
      return reinterpret_cast<V*>(bytes_.data()) + guard_;
    }
    type_ = storage_of<V>();
    sentinel_ = to_double(stored_as<V>(kGuardSentinel));
    encode<V>();
    bytes_ = Buffer<unsigned char>(*mem_, int64_t(initial_.size()));
    bytes_.upload(initial_.data(), bytes_.size());
    return reinterpret_cast<V*>(bytes_.data()) + guard_;
  }
  const MemoryOps* mem_;
  const std::vector<double>* values_;
  int64_t guard_;
  Buffer<unsigned char> bytes_;
  Buffer<unsigned char> pristine_;      // initial_ in the same memory, once poison() needs it
  std::vector<unsigned char> initial_;  // what bytes_ held when bound
  Storage type_ = Storage::F32;
  double sentinel_ = 0;
};

// Token ids in a backend's memory between two guards of -1s, and what they were.
class BoundIds {
 public:
  BoundIds(const MemoryOps& mem, const std::vector<TokenId>& ids, int64_t guard)
      : mem_(&mem), initial_(ids.size() + 2 * size_t(guard), -1), guard_(guard) {
    std::copy(ids.begin(), ids.end(), initial_.begin() + guard_);
    ids_ = Buffer<TokenId>(mem, int64_t(initial_.size()));
    ids_.upload(initial_.data(), ids_.size());
  }
  const TokenId* data() const { return ids_.data() + guard_; }
  // As BoundArray's: ids of 0 (in range, so a kernel that reads them early computes wrong rows
  // rather than faulting) until the stream brings the real ones.
  void poison() { poison_buffer(*mem_, ids_, pristine_, initial_, TokenId(0)); }
  void restore_on(void* stream) { restore_buffer(*mem_, stream, ids_, pristine_); }
  void refill(const std::vector<TokenId>& ids) {
    if (ids.size() + 2 * size_t(guard_) != initial_.size())
      throw std::logic_error("run_op: ids refilled with another count");
    std::copy(ids.begin(), ids.end(), initial_.begin() + guard_);
    ids_.upload(initial_.data(), ids_.size());
  }
  std::string change() const {
    const std::vector<TokenId> now = ids_.to_vector();
    const auto bytes = [](const std::vector<TokenId>& v) {
      const auto* p = reinterpret_cast<const unsigned char*>(v.data());
      return std::vector<unsigned char>(p, p + v.size() * sizeof(TokenId));
    };
    return BoundArray::first_change(bytes(now), bytes(initial_),
                                    int64_t(initial_.size()) - 2 * guard_, guard_);
  }

 private:
  const MemoryOps* mem_;
  std::vector<TokenId> initial_;
  int64_t guard_;
  Buffer<TokenId> ids_, pristine_;
};

// An output whose guard before or after it changed, as a call's stray writes.
inline void note_output_guards(size_t o, bool before, bool after, std::vector<std::string>* lines) {
  if (before) lines->push_back("output " + std::to_string(o) + ": write before its start");
  if (after) lines->push_back("output " + std::to_string(o) + ": write past its end");
}
// Every array the call only reads (each input, the token ids) that changed, as its stray writes.
template <class Array>
void note_input_changes(const std::vector<Array>& in, const BoundIds& ids,
                        std::vector<std::string>* lines) {
  for (size_t i = 0; i < in.size(); ++i)
    if (const std::string where = in[i].change(); !where.empty())
      lines->push_back("input " + std::to_string(i) + ": " + where +
                       "; an op's inputs are read-only");
  if (const std::string where = ids.change(); !where.empty())
    lines->push_back("token ids: " + where + "; an op's inputs are read-only");
}

// One op call's arrays in a backend's memory, each with guards: the inputs, the outputs, the ids.
struct BoundCall {
  std::vector<BoundArray> in, out;
  BoundIds ids;
  BoundCall(const MemoryOps& mem, const OpInputs& x) : ids(mem, x.ids, guard_values(x)) {
    for (const auto& v : x.values) in.emplace_back(mem, v, guard_values(x));
    for (const auto& v : x.outputs) out.emplace_back(mem, v, guard_values(x));
  }
  // Values before every array: the guard, and one more where the call's arrays start misaligned.
  static int64_t guard_values(const OpInputs& x) { return kGuardValues + (x.misaligned ? 1 : 0); }
  const TokenId* id_data() const { return ids.data(); }
  // Every input and the ids poisoned now and restored once `stream` gets there (BoundArray).
  void poison_inputs() {
    for (BoundArray& a : in) a.poison();
    ids.poison();
  }
  void restore_inputs_on(void* stream) {
    for (BoundArray& a : in) a.restore_on(stream);
    ids.restore_on(stream);
  }
  // Another call's values into the same arrays (the same sizes), as training's next step.
  void refill(const OpInputs& x) {
    for (size_t i = 0; i < in.size(); ++i) in[i].refill(x.values.at(i));
    for (size_t o = 0; o < out.size(); ++o) out[o].refill(x.outputs.at(o));
    ids.refill(x.ids);
  }
  // The outputs as doubles, and every write outside them: past an output's ends, or into an
  // input or the ids (one download each). An output the call passed as null (a loss-only
  // cross-entropy) is its initial contents.
  OpRun read() const {
    OpRun r;
    for (size_t o = 0; o < out.size(); ++o) {
      if (!out[o].bound()) {
        r.outputs.push_back(out[o].initial_values());
        continue;
      }
      BoundArray::Result got = out[o].read();
      note_output_guards(o, got.before_changed, got.after_changed, &r.stray_writes);
      r.outputs.push_back(std::move(got.values));
    }
    note_input_changes(in, ids, &r.stray_writes);
    return r;
  }
};

// Runs `call(k, in, ids, out)` (in, out: std::vector<BoundArray>, passed to the kernel as its
// pointer arguments) with every tensor in k's memory; returns the outputs as doubles and any
// guard value that changed.
template <class KS, class F>
OpRun run_op(const KS& k, const OpInputs& x, F&& call) {
  BoundCall b(*k.memory, x);
  call(k, b.in, b.id_data(), b.out);
  return b.read();
}

}  // namespace divlab
