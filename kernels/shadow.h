// Shadow mode: evaluate candidate variants on a run's own live inputs, without touching the run.
//
// On an armed step the tap records the inputs of every call of every shadowed op (per-layer ops
// are called once per block; linear_forward five times per block and once for the LM head).
// Afterwards each listed variant runs on copies of those inputs, and its outputs are compared
// with the op's reference evaluated in fp64 on the same inputs; the metrics pool all calls. The run
// itself calls its own kernels unchanged, so its trajectory is bitwise the same with or without
// shadowing.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kernels/registry.h"

namespace divlab {

struct ShadowSpec {
  std::string op, variant;
};
// Parses "op=variant" entries, variants named in `catalogue` (the run's backend); throws
// UnknownKernel naming the entry for an unknown op or variant, or an op shadow mode cannot
// evaluate.
std::vector<ShadowSpec> parse_shadow_specs(
    const std::vector<std::string>& entries,
    const Catalogue<float>& catalogue = cpu_catalogue<float>());
// Ops whose inputs the tap can capture.
std::vector<std::string> shadowable_ops();

// Token-frequency buckets: an output row belongs to the bucket of its token's count in the
// step's batch (embedding rows: the id's count; per-position rows: the count of that position's
// id).
inline const std::vector<std::string>& frequency_bucket_labels() {
  static const std::vector<std::string> labels = {"1",      "2-3",      "4-15", "16-63",
                                                  "64-255", "256-1023", "1024+"};
  return labels;
}
int frequency_bucket(int64_t count);  // -1 for count 0

struct ShadowMetrics {
  double rel_l2 = 0;       // ||v - r|| / ||r|| over every output element
  double max_row_rel = 0;  // max over rows with ||r_row|| > 0 of ||v_row - r_row|| / ||r_row||
  double cosine = 0;       // <v, r> / (||v|| ||r||)
  std::vector<double> bucket_rel_l2;  // per frequency bucket; NaN where the bucket is empty
};

template <class T>
class ShadowTap {
 public:
  // The variants come from `variants` (the run's backend): on the GPU the candidates run as GPU
  // kernels on uploaded copies of the recorded inputs; the fp64 reference always runs on the CPU.
  ShadowTap(const KernelSet<T>& run_kernels, const std::vector<ShadowSpec>& specs,
            const Catalogue<T>& variants);
  ~ShadowTap();
  // The kernels the model should call: the run's own, with taps on the shadowed ops.
  const KernelSet<T>& kernels() const { return tapped_; }
  // Record the calls of the shadowed ops until evaluate().
  void arm();
  // Evaluates every spec on what was recorded since arm(), given the batch's input tokens.
  // Returns one result per spec (in spec order).
  std::vector<ShadowMetrics> evaluate(const TokenId* batch_tokens, int64_t n, int vocab);

  // One op's recorded call: its inputs converted exactly to double, its sizes and scalars.
  struct Capture {
    std::vector<std::vector<double>> inputs;
    std::vector<TokenId> ids;  // token ids (embedding op) or targets (cross-entropy)
    std::vector<int> dims;
    double scalar = 0;  // eps (rmsnorm_forward) or dloss (cross_entropy)
  };
  // Used by the tap functions: the run's kernels, and whether `op` should be recorded now.
  const KernelSet<T>& run_kernels() const { return run_; }
  bool wants(const std::string& op) const { return armed_ && wanted_.count(op); }
  void store(const std::string& op, Capture c) { captured_[op].push_back(std::move(c)); }

 private:
  KernelSet<T> run_, tapped_;
  const Catalogue<T>& variants_;
  std::vector<ShadowSpec> specs_;
  std::map<std::string, int> wanted_;
  std::map<std::string, std::vector<Capture>> captured_;
  bool armed_ = false;
};

}  // namespace divlab
