// Running one op call on any backend from host inputs, with guard regions around every output:
// what `divlab check` and the GPU tests use to compare a kernel against the fp64 reference
// (ggml's test-backend-ops idea: same inputs everywhere, one error measure, stray writes caught).
#pragma once

#include <string>
#include <vector>

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

// Runs `call(k, in, ids, out)` with every tensor in k's memory; returns the outputs as doubles
// and any guard value that changed.
template <class U, class F>
OpRun run_op(const KernelSet<U>& k, const OpInputs& x, F&& call) {
  const MemoryOps& mem = *k.memory;
  std::vector<Buffer<U>> in;
  std::vector<U*> in_p;
  for (const auto& v : x.values) {
    in.emplace_back(mem, int64_t(v.size()));
    in.back().assign(v);
    in_p.push_back(in.back().data());
  }
  Buffer<TokenId> ids(mem, int64_t(x.ids.size()));
  ids.upload(x.ids.data(), int64_t(x.ids.size()));
  std::vector<Buffer<U>> out;
  std::vector<U*> out_p;
  for (const auto& v : x.outputs) {
    std::vector<U> host(v.size() + 2 * kGuardValues, U(kGuardSentinel));
    for (size_t i = 0; i < v.size(); ++i) host[kGuardValues + i] = U(v[i]);
    out.emplace_back(mem, int64_t(host.size()));
    out.back().upload(host.data(), int64_t(host.size()));
    out_p.push_back(out.back().data() + kGuardValues);
  }
  call(k, in_p, ids.data(), out_p);
  OpRun r;
  for (size_t o = 0; o < out.size(); ++o) {
    const std::vector<U> host = out[o].to_vector();
    const size_t n = x.outputs[o].size();
    bool before = false, after = false;
    for (int64_t g = 0; g < kGuardValues; ++g) {
      before = before || !(host[g] == U(kGuardSentinel));
      after = after || !(host[kGuardValues + n + g] == U(kGuardSentinel));
    }
    if (before)
      r.stray_writes.push_back("output " + std::to_string(o) + ": write before its start");
    if (after) r.stray_writes.push_back("output " + std::to_string(o) + ": write past its end");
    r.outputs.emplace_back(host.begin() + kGuardValues, host.begin() + kGuardValues + int64_t(n));
  }
  return r;
}

}  // namespace divlab
