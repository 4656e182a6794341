#include "runtime/optim/sgd.hpp"

#include <cmath>

namespace ashlar {

const char* to_string(update_rule r) {
  switch (r) {
    case update_rule::adam: return "adam";
    case update_rule::adamw: return "adamw";
    case update_rule::sgd: break;
  }
  return "sgd";
}

bool parse_update_rule(const std::string& name, update_rule& out) {
  for (auto r : {update_rule::sgd, update_rule::adam, update_rule::adamw})
    if (name == to_string(r)) {
      out = r;
      return true;
    }
  return false;
}

void sgd_apply(const sgd_config& cfg, float lr_scale, float* w, float* v, const float* g,
               size_t n) {
  const float lr = cfg.lr * lr_scale;
  const float mu = cfg.momentum;
  const float wd = cfg.weight_decay;
  if (mu == 0.0f) {
    // No momentum: the buffer would only hold this step's gradient; skip its traffic.
    for (size_t i = 0; i < n; ++i)
      w[i] -= lr * (g[i] + wd * w[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    float d = g[i] + wd * w[i];
    float vi = mu * v[i] + d;
    v[i] = vi;
    w[i] -= lr * vi;
  }
}

void optimizer_apply(const sgd_config& cfg, float lr_scale, float* w, float* m, float* v, const float* g, size_t n,
                     uint64_t step) {
  if (cfg.rule == update_rule::sgd)
    return sgd_apply(cfg, lr_scale, w, m, g, n);
  // torch.optim.Adam / AdamW (amsgrad off): step_size = lr / (1 - beta1^t), denominator
  // sqrt(v) / sqrt(1 - beta2^t) + eps.
  const double t = static_cast<double>(step == 0 ? 1 : step);
  const float lr = cfg.lr * lr_scale;
  const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(b1), t)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  const float wd = cfg.weight_decay;
  const bool decoupled = cfg.rule == update_rule::adamw;
  const float shrink = 1.0f - lr * wd;
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (decoupled)
      w[i] *= shrink;
    else
      gi += wd * w[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

}  // namespace ashlar
