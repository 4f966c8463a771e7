// One test case per op, reused for every backend and mode (ggml's test-backend-ops idea): the
// inputs and the call come from kernels/op_cases.h, which has a case for every op of the op list,
// so a new op is tested on every catalogue without a line written here.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/op_cases.h"
#include "tests/support/check.h"

namespace divlab::testing {

// The shapes every op is tested at: one with sizes that are multiples of nothing (B 3, T 37,
// C 72, 4 heads of 18, V 301) and two drawn at random (printed on failure with the seed).
inline std::vector<OpShape> every_op_shapes(std::mt19937_64& gen) {
  return {OpShape{3, 37, 72, 4, 301}, random_shape(gen), random_shape(gen)};
}

// Arrays one value past a 16-byte boundary (OpInputs::misaligned), at shapes whose widths are
// multiples of 8 values, where a kernel takes its packed path if it only looks at sizes; and at
// the awkward one.
inline std::vector<OpShape> misaligned_shapes() {
  return {OpShape{4, 64, 128, 4, 512}, OpShape{2, 16, 1024, 8, 64}, OpShape{3, 37, 72, 4, 301}};
}

// Token ids, Zipf-like (id k with weight 1/(k+1)), so some rows collect many contributions.
inline std::vector<TokenId> zipf_tokens(const OpShape& s, std::mt19937_64& gen) {
  std::vector<double> w(size_t(s.V));
  for (size_t k = 0; k < w.size(); ++k) w[k] = 1.0 / double(k + 1);
  std::discrete_distribution<int> d(w.begin(), w.end());
  std::vector<TokenId> ids(size_t(s.tokens()));
  for (auto& t : ids) t = TokenId(d(gen));
  return ids;
}

// The inputs of `op` at `s`, with scalars drawn as check draws them; rounded to bf16 first for a
// bf16-mode kernel set, as the model stores activations, so both sides compute from the same
// values and the comparison measures the kernel.
inline OpInputs every_op_inputs(const std::string& op, const OpShape& s, bool bf16_mode,
                                std::mt19937_64& gen) {
  OpInputs x = op_inputs(op, s, zipf_tokens(s, gen), Values::Normal, gen);
  x.scalars = random_scalars(gen);
  if (bf16_mode)
    for (auto& v : x.values) round_to_bf16(v);
  return x;
}

// Runs `op` of `k` on `x` and compares every output it writes with the fp64 CPU reference: the
// normalised error below `tol`, outputs the op adds into judged on the call's own contribution
// (so a parameter update is measured, not the parameter), saved intermediates in the kernel's
// own format skipped, no write outside an output. Returns what `k` computed.
template <class KS>
OpRun expect_op_matches_fp64(const std::string& op, const KS& k, const OpInputs& x,
                             const OpShape& s, double tol, const std::string& what) {
  std::vector<ArgSpec> written;
  const OpRun ref = call_op(op, cpu_catalogue<double>().select({}), x, s, &written);
  OpRun got = call_op(op, k, x, s);
  for (const auto& w : got.stray_writes) ADD_FAILURE() << what << ": " << w;
  const std::string where = what + " at " + s.text();
  for (size_t o = 0; o < written.size(); ++o) {
    if (written[o].role == ArgRole::Saved) continue;
    std::vector<double> a = got.outputs[o], b = ref.outputs[o];
    if (written[o].role == ArgRole::Accumulate)
      for (size_t i = 0; i < a.size(); ++i) a[i] -= x.outputs[o][i], b[i] -= x.outputs[o][i];
    EXPECT_CLOSE(a, b, tol, where + ", output " + std::to_string(o));
  }
  return got;
}

}  // namespace divlab::testing
