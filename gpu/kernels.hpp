// Launchers for the CUDA backend's element-wise kernels (gpu/kernels.cu). Every one is
// asynchronous on `stream`; the caller checks cudaGetLastError() after a launch.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ashlar::gpu {

/// out[r][c] += bias[c] for an n x cols row-major matrix, then ReLU when `relu`.
void launch_bias_act(float* out, const float* bias, size_t n, size_t cols, bool relu, cudaStream_t stream);

/// Softmax cross-entropy over n rows of `classes` logits with labels y: adds the summed
/// loss to *loss_sum and the correct predictions to *correct. With `delta` (n x classes),
/// writes dLoss/dLogits of the batch mean: (softmax - onehot) / n.
void launch_softmax_xent(const float* logits, const uint8_t* y, size_t n, size_t classes, float* delta,
                         double* loss_sum, unsigned long long* correct, cudaStream_t stream);

/// delta[i] = 0 where act[i] <= 0 (ReLU's derivative), for `count` entries.
void launch_relu_mask(float* delta, const float* act, size_t count, cudaStream_t stream);

/// x[i] = a pseudo-random value in [-1, 1) from (seed, i), for `count` entries.
void launch_fill_random(float* x, uint64_t seed, size_t count, cudaStream_t stream);

/// x[i] = value for `count` entries.
void launch_fill(float* x, float value, size_t count, cudaStream_t stream);

}  // namespace ashlar::gpu

namespace ashlar::gpu {

/// A local step on a kept model (runtime/optim/local_steps.hpp's arithmetic): with
/// momentum > 0, velocity = momentum * velocity + grad and the update is the velocity,
/// else the gradient; acc += update; params -= lr * update. `count` entries.
void launch_local_update(float* params, float* velocity, float* acc, const float* grad, size_t count, float lr,
                         float momentum, cudaStream_t stream);

/// out = acc * scale, then acc = 0.
void launch_take(float* out, float* acc, float scale, size_t count, cudaStream_t stream);

/// params -= lr * acc (params holding the pulled model: pulled - lr * acc).
void launch_rebase(float* params, const float* acc, float lr, size_t count, cudaStream_t stream);

}  // namespace ashlar::gpu
