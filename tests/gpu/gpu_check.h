// Helpers for GPU tests: skip (not fail) without a usable GPU, and run one op call with the same
// host inputs on any backend, with guard regions around every output to catch stray writes.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/ops.h"
#include "tests/support/check.h"

namespace divlab::testing {

// Tolerances of the normalised error (max |a - b| / max |b|) against the fp64 CPU reference.
constexpr double kTolGpuFp32 = 1e-5;  // fp32 arithmetic, sums of up to a few hundred terms
constexpr double kTolGpuBf16 = 1e-2;  // GEMM inputs rounded to bf16 (2^-9 relative each)

inline bool have_gpu() {
  static const bool ok = [] {
    try {
      open_backend("cuda");
      return true;
    } catch (const BackendError&) {
      return false;
    }
  }();
  return ok;
}
#define REQUIRE_GPU() \
  if (!::divlab::testing::have_gpu()) GTEST_SKIP() << "no usable GPU"

constexpr int64_t kGuard = 1024;  // values before and after every output
constexpr float kSentinel = -12345.678f;

struct OpInputs {
  std::vector<std::vector<double>> values;  // float tensors
  std::vector<TokenId> ids;                 // token ids or targets
  std::vector<std::vector<double>> outputs;  // initial contents of every output (zeros mostly)
};

// Runs `call(k, in, ids, out)` with tensors in k's memory; returns the outputs as doubles.
// Fails the test if a guard value changed.
template <class U, class F>
std::vector<std::vector<double>> run_op(const KernelSet<U>& k, const OpInputs& x, F&& call) {
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
    std::vector<U> host(v.size() + 2 * kGuard, U(kSentinel));
    for (size_t i = 0; i < v.size(); ++i) host[kGuard + i] = U(v[i]);
    out.emplace_back(mem, int64_t(host.size()));
    out.back().upload(host.data(), int64_t(host.size()));
    out_p.push_back(out.back().data() + kGuard);
  }
  call(k, in_p, ids.data(), out_p);
  std::vector<std::vector<double>> result;
  for (size_t o = 0; o < out.size(); ++o) {
    const std::vector<U> host = out[o].to_vector();
    const size_t n = x.outputs[o].size();
    for (int64_t g = 0; g < kGuard; ++g) {
      EXPECT_EQ(host[g], U(kSentinel)) << "output " << o << ": write before its start";
      EXPECT_EQ(host[kGuard + n + g], U(kSentinel)) << "output " << o << ": write past its end";
    }
    result.emplace_back(host.begin() + kGuard, host.begin() + kGuard + int64_t(n));
  }
  return result;
}

inline const Catalogue<float>& gpu(cuda::GemmMode mode = cuda::GemmMode::Fp32) {
  return cuda::catalogue(mode);
}

}  // namespace divlab::testing
