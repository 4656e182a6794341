// SGD with momentum and weight decay, as a server shard applies it to its range.
#pragma once

#include <cstddef>

namespace ashlar {

/// Optimizer settings (PyTorch's SGD semantics: decay is added to the gradient,
/// then v = momentum * v + g, w -= lr * v).
struct sgd_config {
  /// Learning rate. Default: 0.05.
  float lr = 0.05f;
  /// Momentum factor; 0 disables momentum. Default: 0.9.
  float momentum = 0.9f;
  /// L2 weight decay added to the gradient. Default: 0.0001.
  float weight_decay = 1e-4f;
};

/// Applies one update to `n` parameters in place with momentum buffer `velocity`.
/// `lr_scale` multiplies the learning rate (staleness-aware policies lower it).
void sgd_apply(const sgd_config& cfg, float lr_scale, float* params, float* velocity,
               const float* grad, size_t n);

}  // namespace ashlar
