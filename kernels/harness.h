// Running one op call on any backend from host inputs, with guard regions around every output:
// what `divlab check` and the GPU tests use to compare a kernel against the fp64 reference
// (ggml's test-backend-ops idea: same inputs everywhere, one error measure, stray writes caught).
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common/lowp.h"
#include "kernels/registry.h"

namespace divlab {

struct OpInputs {
  std::vector<std::vector<double>> values;   // the op's float tensors, in signature order
  std::vector<TokenId> ids;                  // token ids or targets
  std::vector<std::vector<double>> outputs;  // initial contents of every output
};

struct OpRun {
  std::vector<std::vector<double>> outputs;
  std::vector<std::string> stray_writes;  // "output 1: write past its end", ...
};

constexpr int64_t kGuardValues = 1024;  // values before and after every output
constexpr float kGuardSentinel = -12345.678f;

// One of an op call's tensors, given as doubles and bound to the backend's memory in whatever
// storage type the kernel's parameter asks for (T or the activation type A: the conversion
// operator sees the parameter's type), with guard regions around it for outputs.
class BoundArray {
 public:
  BoundArray(const MemoryOps& mem, const std::vector<double>& values, int64_t guard)
      : mem_(&mem), values_(&values), guard_(guard) {}
  template <class V>
  operator V*() {
    return bind<std::remove_const_t<V>>();
  }
  bool bound() const { return !bytes_.empty(); }
  // Puts the initial contents (guards included) back, for another call on the same arrays.
  void rewrite() {
    if (bound()) bytes_.upload(initial_.data(), int64_t(initial_.size()));
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

 private:
  template <class V>
  V* bind() {
    if (bound()) {
      if (type_ != storage_of<V>())
        throw std::logic_error("run_op: one tensor passed as two storage types");
      return reinterpret_cast<V*>(bytes_.data()) + guard_;
    }
    type_ = storage_of<V>();
    sentinel_ = to_double(stored_as<V>(kGuardSentinel));
    std::vector<V> host(values_->size() + 2 * size_t(guard_), stored_as<V>(kGuardSentinel));
    for (size_t i = 0; i < values_->size(); ++i)
      host[size_t(guard_) + i] = stored_as<V>((*values_)[i]);
    const auto* first = reinterpret_cast<const unsigned char*>(host.data());
    initial_.assign(first, first + host.size() * sizeof(V));
    bytes_ = Buffer<unsigned char>(*mem_, int64_t(initial_.size()));
    bytes_.upload(initial_.data(), bytes_.size());
    return reinterpret_cast<V*>(bytes_.data()) + guard_;
  }
  const MemoryOps* mem_;
  const std::vector<double>* values_;
  int64_t guard_;
  Buffer<unsigned char> bytes_;
  std::vector<unsigned char> initial_;  // what bytes_ held when bound
  Storage type_ = Storage::F32;
  double sentinel_ = 0;
};

// The outputs as doubles and any guard value that changed (one download each).
inline OpRun read_outputs(const std::vector<BoundArray>& out) {
  OpRun r;
  for (size_t o = 0; o < out.size(); ++o) {
    BoundArray::Result got = out[o].read();
    if (got.before_changed)
      r.stray_writes.push_back("output " + std::to_string(o) + ": write before its start");
    if (got.after_changed)
      r.stray_writes.push_back("output " + std::to_string(o) + ": write past its end");
    r.outputs.push_back(std::move(got.values));
  }
  return r;
}

// One op call's arrays in a backend's memory: the inputs, the outputs with guards, the ids.
struct BoundCall {
  std::vector<BoundArray> in, out;
  Buffer<TokenId> ids;
  BoundCall(const MemoryOps& mem, const OpInputs& x) : ids(mem, int64_t(x.ids.size())) {
    for (const auto& v : x.values) in.emplace_back(mem, v, 0);
    for (const auto& v : x.outputs) out.emplace_back(mem, v, kGuardValues);
    ids.upload(x.ids.data(), int64_t(x.ids.size()));
  }
};

// Runs `call(k, in, ids, out)` (in, out: std::vector<BoundArray>, passed to the kernel as its
// pointer arguments) with every tensor in k's memory; returns the outputs as doubles and any
// guard value that changed.
template <class KS, class F>
OpRun run_op(const KS& k, const OpInputs& x, F&& call) {
  BoundCall b(*k.memory, x);
  call(k, b.in, b.ids.data(), b.out);
  return read_outputs(b.out);
}

}  // namespace divlab
