#include "runtime/optim/local_steps.hpp"

namespace ashlar::local_steps {

void apply_momentum(float* grad, float* velocity, float momentum, size_t n) {
  if (momentum <= 0)
    return;
  for (size_t j = 0; j < n; ++j)
    grad[j] = velocity[j] = momentum * velocity[j] + grad[j];
}

void accumulate(float* acc, const float* update, size_t n) {
  for (size_t j = 0; j < n; ++j)
    acc[j] += update[j];
}

void move(float* params, const float* update, float lr, size_t n) {
  for (size_t j = 0; j < n; ++j)
    params[j] -= lr * update[j];
}

void take(float* out, float* acc, float scale, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    out[j] = acc[j] * scale;
    acc[j] = 0.0f;
  }
}

void rebase(float* params, const float* pulled, const float* acc, float lr, size_t n) {
  for (size_t j = 0; j < n; ++j)
    params[j] = pulled[j] - lr * acc[j];
}

}  // namespace ashlar::local_steps
