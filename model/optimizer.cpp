#include "model/optimizer.h"

#include <cmath>

namespace divlab {

double lr_at(const OptimConfig& cfg, int64_t step) {
  if (step < cfg.warmup_steps) return cfg.lr * double(step + 1) / double(cfg.warmup_steps);
  if (cfg.schedule == LrSchedule::Constant) return cfg.lr;
  const double span = double(std::max<int64_t>(1, cfg.total_steps - cfg.warmup_steps));
  const double progress = std::min(1.0, double(step - cfg.warmup_steps) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine);
}

template <class T>
Optimizer<T>::Optimizer(const OptimConfig& cfg, const std::vector<ParamInfo>& layout,
                        const MemoryOps& mem)
    : cfg_(cfg),
      layout_(layout),
      m_(mem, layout.back().offset + layout.back().size),
      v_(mem, cfg.kind == OptimizerKind::AdamW ? layout.back().offset + layout.back().size : 0),
      sum_squares_(mem, int64_t(layout.size())),
      norm_spans_device_(mem, 2 * int64_t(layout.size())) {
  for (const ParamInfo& p : layout) norm_spans_.push_back(p.offset), norm_spans_.push_back(p.size);
  norm_spans_device_.upload(norm_spans_.data(), int64_t(norm_spans_.size()));
  // One span for a model without weight decay; with it, the norm gains (never decayed) split it.
  for (const ParamInfo& p : layout) {
    const double wd = p.is_norm ? 0.0 : cfg.weight_decay;
    if (!spans_.empty() && spans_.back().weight_decay == wd &&
        spans_.back().offset + spans_.back().size == p.offset)
      spans_.back().size += p.size;
    else
      spans_.push_back({p.offset, p.size, wd});
  }
}

template <class T>
template <class A>
StepStats Optimizer<T>::step(Transformer<T, A>& model, int64_t step) {
  const KernelSet<T, A>& k = model.kernels();
  StepStats stats;
  if (k.sum_squares_spans_path()) {
    k.pairs->sum_squares_spans.fused(model.next_op_context(), sum_squares_.data(),
                                     model.grads().data(), norm_spans_device_.data(),
                                     norm_spans_.data(), int(layout_.size()));
    // Every call it stands for is counted: later calls draw the seeds they draw op by op.
    for (size_t i = 1; i < layout_.size(); ++i) model.next_op_context();
  } else {
    for (size_t i = 0; i < layout_.size(); ++i)
      k.sum_squares(model.next_op_context(), sum_squares_.data() + i,
                    model.grads().data() + layout_[i].offset, layout_[i].size);
  }
  double total = 0;
  for (double ss : sum_squares_.to_vector(model.stream())) {
    stats.param_grad_norms.push_back(std::sqrt(ss));
    total += ss;
  }
  stats.grad_norm = std::sqrt(total);
  stats.lr = lr_at(cfg_, step);
  // Non-finite gradients are not applied: the weights stay as they were, so the step can be
  // replayed to find the op that produced them (NaN attribution).
  if (!std::isfinite(stats.grad_norm)) return stats;
  const bool clip = cfg_.grad_clip > 0 && stats.grad_norm > cfg_.grad_clip;
  const T scale = clip ? T(cfg_.grad_clip / (stats.grad_norm + 1e-6)) : T(1);
  const T lr = T(stats.lr);
  // SGD as the pair with the next forward's cast of the weights (bf16 mode): the update writes
  // the copy, over every span, so the cast is skipped.
  A* copy = cfg_.kind == OptimizerKind::Sgd && k.sgd_cast_pair() ? model.weight_copy() : nullptr;
  for (const UpdateSpan& s : spans_) {
    T* w = model.params().data() + s.offset;
    const T* g = model.grads().data() + s.offset;
    const T wd = T(s.weight_decay);
    if (cfg_.kind == OptimizerKind::AdamW) {
      k.adamw_step(model.next_op_context(), w, m_.data() + s.offset, v_.data() + s.offset, g,
                   s.size, lr, T(cfg_.beta1), T(cfg_.beta2), T(cfg_.eps), wd, scale, step + 1);
    } else if (copy) {
      k.pairs->sgd_cast.fused(model.next_op_context(), w, m_.data() + s.offset, g, s.size, lr,
                              T(cfg_.momentum), cfg_.nesterov, wd, scale, copy + s.offset);
    } else {
      k.sgd_step(model.next_op_context(), w, m_.data() + s.offset, g, s.size, lr, T(cfg_.momentum),
                 cfg_.nesterov, wd, scale);
    }
  }
  if (copy) model.weights_cast_by_update();
  return stats;
}

template class Optimizer<float>;
template class Optimizer<double>;
template StepStats Optimizer<float>::step(Transformer<float>&, int64_t);
template StepStats Optimizer<double>::step(Transformer<double>&, int64_t);
template StepStats Optimizer<float>::step(Transformer<float, bf16>&, int64_t);
}  // namespace divlab
