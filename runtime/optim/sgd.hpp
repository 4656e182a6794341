// The shards' optimizers (train.optimizer): SGD with momentum and weight decay, Adam and
// AdamW, as a server shard applies them to its range (and ring workers to their copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ashlar {

/// The update rule. sgd: PyTorch's SGD (decay added to the gradient, then v = momentum
/// * v + g, w -= lr * v). adam: torch.optim.Adam (decay added to the gradient, bias-
/// corrected first and second moments). adamw: torch.optim.AdamW (decay decoupled: w -=
/// lr * decay * w, then Adam's step without it).
enum class update_rule : uint8_t { sgd, adam, adamw };

/// "sgd", "adam", "adamw"; parse_update_rule gives false for any other name.
const char* to_string(update_rule r);
bool parse_update_rule(const std::string& name, update_rule& out);

/// Optimizer settings.
struct sgd_config {
  /// Learning rate. Default: 0.05.
  float lr = 0.05f;
  /// Momentum factor (sgd); 0 disables momentum. Default: 0.9.
  float momentum = 0.9f;
  /// Weight decay (L2 added to the gradient; decoupled under adamw). Default: 0.0001.
  float weight_decay = 1e-4f;
  update_rule rule = update_rule::sgd;
  /// Adam's moment decay rates and the denominator's term.
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

/// Whether the rule keeps a second moment beside the first (Adam's).
inline bool keeps_second_moment(const sgd_config& cfg) { return cfg.rule != update_rule::sgd; }

/// Applies one update to `n` parameters in place with momentum buffer `velocity`.
/// `lr_scale` multiplies the learning rate (staleness-aware policies lower it).
void sgd_apply(const sgd_config& cfg, float lr_scale, float* params, float* velocity,
               const float* grad, size_t n);

/// Applies update number `step` (1 for the first) of cfg's rule to `n` parameters:
/// `first` is SGD's velocity or Adam's first moment, `second` Adam's second moment
/// (unused under sgd).
void optimizer_apply(const sgd_config& cfg, float lr_scale, float* params, float* first, float* second,
                     const float* grad, size_t n, uint64_t step);

}  // namespace ashlar
