#include "runtime/optim/sgd.hpp"

namespace ashlar {

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

}  // namespace ashlar
