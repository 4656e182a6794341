// The arithmetic of a worker's local steps (ADSP, ASHL): the step's update (its gradient,
// or with the worker's own momentum its velocity) moves the local model and adds to the
// open commit; a commit takes the sum, scaled; an overlapped commit's pull lands behind
// the local steps made meanwhile. One definition for the step machine (host memory) and
// for backends that keep the local model themselves (held_model_backend; the CUDA
// backends run the same on their device).
#pragma once

#include <cstddef>

namespace ashlar::local_steps {

/// With momentum > 0: velocity = momentum * velocity + grad, and grad = velocity (the
/// step's update). With 0: the update is the gradient; velocity is not touched.
void apply_momentum(float* grad, float* velocity, float momentum, size_t n);

/// acc += update.
void accumulate(float* acc, const float* update, size_t n);

/// params -= lr * update.
void move(float* params, const float* update, float lr, size_t n);

/// out = acc * scale, then acc = 0.
void take(float* out, float* acc, float scale, size_t n);

/// params = pulled - lr * acc: the pulled model with the local steps since the commit.
void rebase(float* params, const float* pulled, const float* acc, float lr, size_t n);

}  // namespace ashlar::local_steps
