// One op call's arrays at a size no host could hold as doubles: every array that grows with the
// rows is one block of rows (the base call's values) repeated end to end, so the call's exact
// result is the base call's, copy by copy, and only the base call needs an fp64 reference. What
// `divlab check` runs past 2^32 values (call_op_tiled, kernels/op_cases.h): an index kept in 32
// bits wraps there, at any size the base rows fit in.
#pragma once

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/common/lowp.h"
#include "kernels/harness.h"
#include "kernels/op_spec.h"

namespace divlab {

class TiledArray {
 public:
  TiledArray(const MemoryOps& mem, const std::vector<double>& base, int64_t guard)
      : mem_(&mem), base_(&base), guard_(guard) {}
  // The call's own extent for this array (set before it is bound): the base's size repeated
  // copies() times, or the base's size once (a weight, or a weight's gradient summed over every
  // row, which is then the base call's times the copies).
  void take_spec(const ArgSpec& spec) {
    const int64_t n = int64_t(base_->size());
    if (n == 0 || spec.size() % n != 0)
      throw std::logic_error("tiled call: an array's extent is not a multiple of its base");
    count_ = spec.size(), role_ = spec.role;
  }
  ArgRole role() const { return role_; }

  template <class V>
  operator V*() {
    return bind<std::remove_const_t<V>>();
  }
  bool bound() const { return !bytes_.empty(); }
  int64_t base_size() const { return int64_t(base_->size()); }
  int64_t copies() const { return count_ / base_size(); }
  // Summed over the rows (one copy of an array that does not grow, written by a call whose
  // rows do): the base's share is the sum over copies.
  bool summed(int64_t call_copies) const { return copies() == 1 && call_copies > 1; }

  // Copy c's values as stored, and widened.
  std::vector<unsigned char> copy_bytes(int64_t c) const {
    std::vector<unsigned char> host(size_t(base_size()) * width_);
    bytes_.download(host.data(), int64_t(host.size()),
                    (guard_ + c * base_size()) * int64_t(width_));
    return host;
  }
  std::vector<double> widened(const std::vector<unsigned char>& stored) const {
    std::vector<double> v(static_cast<size_t>(base_size()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = stored_value(stored.data(), type_, int64_t(i));
    return v;
  }
  // Whether the guard before (first) or after (second) the values changed.
  std::pair<bool, bool> guards_changed() const {
    const size_t g = size_t(guard_) * width_;
    std::vector<unsigned char> before(g), after(g);
    bytes_.download(before.data(), int64_t(g));
    bytes_.download(after.data(), int64_t(g), int64_t(g + size_t(count_) * width_));
    return {before != guard_bytes_, after != guard_bytes_};
  }
  // For an array the call only reads: where it changed, if it did ("" if not).
  std::string change() const {
    if (!bound()) return "";
    const auto [before, after] = guards_changed();
    if (before) return "write before its start";
    for (int64_t c = 0; c < copies(); ++c)
      if (const std::vector<unsigned char> now = copy_bytes(c); now != base_bytes_)
        for (size_t b = 0; b < now.size(); ++b)
          if (now[b] != base_bytes_[b])
            return "written at value " + std::to_string(c * base_size() + int64_t(b / width_));
    return after ? "write past its end" : "";
  }

 private:
  template <class V>
  V* bind() {
    if (bound()) {
      if (type_ != storage_of<V>())
        throw std::logic_error("tiled call: one tensor passed as two storage types");
      return reinterpret_cast<V*>(bytes_.data()) + guard_;
    }
    type_ = storage_of<V>(), width_ = sizeof(V);
    const V sentinel = stored_as<V>(kGuardSentinel);
    std::vector<V> base(base_->size()), guard(size_t(guard_), sentinel);
    std::transform(base_->begin(), base_->end(), base.begin(), stored_as<V>);
    base_bytes_ = as_bytes(base), guard_bytes_ = as_bytes(guard);
    const size_t values = size_t(count_) * width_, g = guard_bytes_.size();
    bytes_ = Buffer<unsigned char>(*mem_, int64_t(values + 2 * g));
    bytes_.upload(guard_bytes_.data(), int64_t(g));
    bytes_.upload(guard_bytes_.data(), int64_t(g), int64_t(g + values));
    bytes_.upload(base_bytes_.data(), int64_t(base_bytes_.size()), int64_t(g));
    // The copies by doubling what is there: log2(copies) copies in the device's own memory.
    unsigned char* first = bytes_.data() + g;
    for (size_t done = base_bytes_.size(); done < values;) {
      const size_t n = std::min(done, values - done);
      mem_->copy(nullptr, first + done, first, n);
      done += n;
    }
    mem_->synchronize(nullptr);
    return reinterpret_cast<V*>(first);
  }
  template <class V>
  static std::vector<unsigned char> as_bytes(const std::vector<V>& v) {
    std::vector<unsigned char> b(v.size() * sizeof(V));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
  }

  const MemoryOps* mem_;
  const std::vector<double>* base_;
  int64_t guard_;
  int64_t count_ = 0;
  ArgRole role_ = ArgRole::Input;
  Buffer<unsigned char> bytes_;
  std::vector<unsigned char> base_bytes_, guard_bytes_;  // one copy, one guard, as stored
  Storage type_ = Storage::F32;
  size_t width_ = 4;
};

// For the arrays of a call that are not tiled (BoundArray): nothing to note.
template <class X>
void take_spec(X& /*arg*/, const ArgSpec& /*spec*/) {}
inline void take_spec(TiledArray& a, const ArgSpec& spec) {
  a.take_spec(spec);
}

}  // namespace divlab
