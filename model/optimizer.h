// SGD and AdamW over the model's flat parameter buffer, global-norm clipping and the LR schedule.
// The per-element updates are kernels (kernels/optimizer/); this file decides what to call.
#pragma once

#include <string>
#include <vector>

#include "common/named_enum.h"
#include "model/transformer.h"

namespace divlab {

enum class OptimizerKind { Sgd, AdamW };
template <>
struct EnumNames<OptimizerKind> {
  static constexpr std::pair<OptimizerKind, const char*> table[] = {
      {OptimizerKind::Sgd, "sgd"}, {OptimizerKind::AdamW, "adamw"}};
};
// The learning rate after warmup: constant, or cosine decay to lr * min_lr_ratio at total_steps.
enum class LrSchedule { Constant, Cosine };
template <>
struct EnumNames<LrSchedule> {
  static constexpr std::pair<LrSchedule, const char*> table[] = {{LrSchedule::Constant, "constant"},
                                                                 {LrSchedule::Cosine, "cosine"}};
};

struct OptimConfig {
  OptimizerKind kind = OptimizerKind::Sgd;
  double lr = 0.1;
  double momentum = 0.0;      // SGD
  bool nesterov = false;      // SGD
  double weight_decay = 0.0;  // SGD: coupled L2; AdamW: decoupled. Never on RMSNorm gains.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double grad_clip = 0.0;                         // global L2 norm; 0 = off
  int64_t warmup_steps = 0;                       // linear warmup from lr/warmup to lr
  LrSchedule schedule = LrSchedule::Constant;
  double min_lr_ratio = 0.1;
  int64_t total_steps = 1;
};

// Learning rate at 0-based `step`.
double lr_at(const OptimConfig& cfg, int64_t step);

struct StepStats {
  double grad_norm = 0;  // global, before clipping
  double lr = 0;
  std::vector<double> param_grad_norms;  // per layout entry, before clipping
};

template <class T>
class Optimizer {
 public:
  // State lives in `mem` (the model's backend memory).
  Optimizer(const OptimConfig& cfg, const std::vector<ParamInfo>& layout, const MemoryOps& mem);
  // One update from the model's current gradients. `step` is 0-based. Gradients with a
  // non-finite norm are not applied (stats.grad_norm says so).
  template <class A>
  StepStats step(Transformer<T, A>& model, int64_t step);

  // Optimizer state, exposed for checkpoints.
  Buffer<T>& first_moment() { return m_; }
  Buffer<T>& second_moment() { return v_; }  // empty for SGD

 private:
  // A span of the flat parameters updated by one call: neighbouring tensors with the same weight
  // decay (the update is elementwise, so one launch serves them all, bit for bit the same).
  struct UpdateSpan {
    int64_t offset, size;
    double weight_decay;
  };
  OptimConfig cfg_;
  std::vector<ParamInfo> layout_;
  std::vector<UpdateSpan> spans_;  // from the layout, once
  Buffer<T> m_, v_;                // SGD uses m_ as the momentum buffer
  Buffer<double> sum_squares_;     // per layout entry, filled on the backend, downloaded at once
  // Each layout entry's offset and size, on the host and in the backend's memory (the reference
  // path over all of them: ReferencePairs::SumSquaresSpans).
  std::vector<int64_t> norm_spans_;
  Buffer<int64_t> norm_spans_device_;
};

}  // namespace divlab
