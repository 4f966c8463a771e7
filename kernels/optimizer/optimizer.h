// Optimizer kernels: the global gradient norm's sum of squares, SGD and AdamW parameter updates.
#pragma once
#include "kernels/registry.h"

namespace divlab {
template <class T>
void sum_squares_reference(double* out, const T* g, int64_t n);
template <class T>
void sgd_step_reference(T* p, T* buf, const T* g, int64_t n, T lr, T momentum, bool nesterov,
                        T weight_decay, T grad_scale);
template <class T>
void adamw_step_reference(T* p, T* m, T* v, const T* g, int64_t n, T lr, T beta1, T beta2, T eps,
                          T weight_decay, T grad_scale, int64_t step);
template <class T>
void register_optimizer(Catalogue<T>& cat);
}  // namespace divlab
