// Every op of the op list on both CPU catalogues (fp32, and bf16 activations) against the fp64
// reference, at a fixed awkward shape and at random ones, and bitwise repeatable. The GPU runs
// the same cases (kernels/cuda/test_backend_ops.cpp).
#include <gtest/gtest.h>

#include "kernels/bf16_activations.h"
#include "tests/support/every_op.h"

namespace divlab {
using namespace testing;

namespace {
// check's grades: fp32 arithmetic within 1e-4 of fp64 (sums of hundreds of terms; an update
// judged on its own size), bf16 storage within 1e-2 (2^-9 relative per rounding).
constexpr double kTolFp32 = 1e-4, kTolBf16 = 1e-2;

template <class KS>
void every_op(const KS& k, bool bf16_mode, double tol) {
  std::mt19937_64 gen(test_seed());
  for (const OpShape& s : every_op_shapes(gen))
    for (int i = 0; i < kOpCount; ++i) {
      const std::string op = op_name(Op(i));
      const OpInputs x = every_op_inputs(op, s, bf16_mode, gen);
      const OpRun first = expect_op_matches_fp64(op, k, x, s, tol, op);
      EXPECT_EQ(first.outputs, call_op(op, k, x, s).outputs)
          << op << " at " << s.text() << ": not bitwise repeatable (seed " << test_seed() << ")";
    }
}
}  // namespace

// The trainer packs its parameters, gradients and optimizer state without padding, so at some
// widths the ops on them get arrays at any value's offset: every reference takes them there.
template <class KS>
void every_op_misaligned(const KS& k, bool bf16_mode, double tol) {
  std::mt19937_64 gen(test_seed());
  for (const OpShape& s : misaligned_shapes())
    for (const Op o : ops_on_packed_tensors()) {
      const std::string op = op_name(o);
      OpInputs x = every_op_inputs(op, s, bf16_mode, gen);
      x.misaligned = true;
      expect_op_matches_fp64(op, k, x, s, tol, op + " (arrays misaligned)");
    }
}

TEST(EveryOp, Fp32CpuReferencesMatchFp64) {
  every_op(cpu_catalogue<float>().select({}), false, kTolFp32);
}

TEST(EveryOp, Bf16ActivationCpuReferencesMatchFp64) {
  every_op(cpu_bf16_catalogue().select({}), true, kTolBf16);
}

TEST(EveryOp, CpuReferencesTakeArraysAtAnyOffset) {
  every_op_misaligned(cpu_catalogue<float>().select({}), false, kTolFp32);
  every_op_misaligned(cpu_bf16_catalogue().select({}), true, kTolBf16);
}

}  // namespace divlab
