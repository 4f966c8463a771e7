// Helpers for GPU tests: skip (not fail) without a usable GPU, and run one op call with the same
// host inputs on any backend, with guard regions around every output to catch stray writes.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/harness.h"
#include "tests/support/check.h"

namespace divlab::testing {

// Tolerances of the normalised error (max |a - b| / max |b|) against the fp64 CPU reference.
constexpr double kTolGpuFp32 = 1e-5;  // fp32 arithmetic, sums of up to a few hundred terms
constexpr double kTolGpuBf16 = 1e-2;  // bf16 operands and outputs (2^-9 relative each)

inline bool have_gpu() {
  static const bool ok = [] {
    try {
      open_backend(Backend::Cuda);
      return true;
    } catch (const BackendError&) {
      return false;
    }
  }();
  return ok;
}
#define REQUIRE_GPU() \
  if (!::divlab::testing::have_gpu()) GTEST_SKIP() << "no usable GPU"

// The shared harness, failing the test on any stray write.
template <class U, class A = U, class F>
std::vector<std::vector<double>> run_checked(const KernelSet<U, A>& k, const OpInputs& x,
                                             F&& call) {
  OpRun r = ::divlab::run_op(k, x, call);
  for (const auto& w : r.stray_writes) ADD_FAILURE() << w;
  return std::move(r.outputs);
}

// An output buffer's initial contents for ops that overwrite it.
inline std::vector<double> zeros(size_t n) {
  return std::vector<double>(n, 0.0);
}

// The GPU catalogue of one mode: activations stored as A (float: fp32 mode; bf16: bf16 mode).
template <class A>
const Catalogue<float, A>& gpu_catalogue() {
  if constexpr (std::is_same_v<A, bf16>)
    return cuda::bf16_catalogue();
  else
    return cuda::catalogue();
}
inline const Catalogue<float>& gpu() {
  return cuda::catalogue();
}

// For typed tests over both GPU modes: TYPED_TEST_SUITE(Suite, StorageTypes, StorageName).
using StorageTypes = ::testing::Types<float, bf16>;
struct StorageName {
  template <class A>
  static std::string GetName(int) {
    return std::is_same_v<A, bf16> ? "bf16" : "fp32";
  }
};

}  // namespace divlab::testing
