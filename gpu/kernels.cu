// The CUDA backend's element-wise kernels: bias and ReLU, softmax cross-entropy with its
// gradient, ReLU's derivative. The matrix products are cuBLAS's (gpu/cuda_backend.cpp).
#include "gpu/kernels.hpp"

#include <cfloat>

#include "gpu/launch.cuh"

namespace ashlar::gpu {
namespace {

__global__ void bias_act(float* __restrict__ out, const float* __restrict__ bias, size_t n, size_t cols,
                         bool relu) {
  const size_t count = n * cols;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    float v = out[i] + bias[i % cols];
    out[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

// One warp per row: the row's max, log-sum-exp, loss, argmax and gradient.
__global__ void softmax_xent(const float* __restrict__ logits, const uint8_t* __restrict__ y, size_t n,
                             size_t classes, float* __restrict__ delta, double* loss_sum,
                             unsigned long long* correct) {
  const size_t warps_per_block = blockDim.x / 32;
  const size_t row = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= n)
    return;
  const float* z = logits + row * classes;
  float mx = -FLT_MAX;
  int arg = 0;
  for (size_t c = lane; c < classes; c += 32)
    if (z[c] > mx) {
      mx = z[c];
      arg = static_cast<int>(c);
    }
  for (int off = 16; off > 0; off /= 2) {
    float om = __shfl_down_sync(0xffffffffu, mx, off);
    int oa = __shfl_down_sync(0xffffffffu, arg, off);
    if (om > mx || (om == mx && oa < arg)) {
      mx = om;
      arg = oa;
    }
  }
  mx = __shfl_sync(0xffffffffu, mx, 0);
  arg = __shfl_sync(0xffffffffu, arg, 0);
  double sum = 0;
  for (size_t c = lane; c < classes; c += 32)
    sum += exp(static_cast<double>(z[c] - mx));
  for (int off = 16; off > 0; off /= 2)
    sum += __shfl_down_sync(0xffffffffu, sum, off);
  sum = __shfl_sync(0xffffffffu, sum, 0);
  const double log_sum = log(sum);
  const unsigned label = y[row];
  if (delta) {
    const float inv_n = 1.0f / static_cast<float>(n);
    float* d = delta + row * classes;
    for (size_t c = lane; c < classes; c += 32) {
      float p = static_cast<float>(exp(static_cast<double>(z[c] - mx) - log_sum));
      d[c] = (p - (c == label ? 1.0f : 0.0f)) * inv_n;
    }
  }
  if (lane == 0) {
    atomicAdd(loss_sum, log_sum - static_cast<double>(z[label] - mx));
    if (static_cast<unsigned>(arg) == label)
      atomicAdd(correct, 1ull);
  }
}

__global__ void relu_mask(float* __restrict__ delta, const float* __restrict__ act, size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x)
    if (act[i] <= 0.0f)
      delta[i] = 0.0f;
}

__global__ void fill(float* x, float value, size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x)
    x[i] = value;
}

__global__ void fill_random(float* x, uint64_t seed, size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull; // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
}

__global__ void local_update(float* __restrict__ params, float* __restrict__ velocity, float* __restrict__ acc,
                             const float* __restrict__ grad, size_t count, float lr, float momentum) {
  ASHLAR_GRID_LOOP(i, count) {
    float u = grad[i];
    if (momentum > 0.0f) {
      u = momentum * velocity[i] + u;
      velocity[i] = u;
    }
    acc[i] += u;
    params[i] -= lr * u;
  }
}

__global__ void take(float* __restrict__ out, float* __restrict__ acc, float scale, size_t count) {
  ASHLAR_GRID_LOOP(i, count) {
    out[i] = acc[i] * scale;
    acc[i] = 0.0f;
  }
}

__global__ void rebase(float* __restrict__ params, const float* __restrict__ acc, float lr, size_t count) {
  ASHLAR_GRID_LOOP(i, count)
  params[i] -= lr * acc[i];
}

}  // namespace

void launch_local_update(float* params, float* velocity, float* acc, const float* grad, size_t count, float lr,
                         float momentum, cudaStream_t stream) {
  local_update<<<blocks_for(count), threads, 0, stream>>>(params, velocity, acc, grad, count, lr, momentum);
}

void launch_take(float* out, float* acc, float scale, size_t count, cudaStream_t stream) {
  take<<<blocks_for(count), threads, 0, stream>>>(out, acc, scale, count);
}

void launch_rebase(float* params, const float* acc, float lr, size_t count, cudaStream_t stream) {
  rebase<<<blocks_for(count), threads, 0, stream>>>(params, acc, lr, count);
}

void launch_fill_random(float* x, uint64_t seed, size_t count, cudaStream_t stream) {
  fill_random<<<blocks_for(count), threads, 0, stream>>>(x, seed, count);
}

void launch_bias_act(float* out, const float* bias, size_t n, size_t cols, bool relu, cudaStream_t stream) {
  bias_act<<<blocks_for(n * cols), threads, 0, stream>>>(out, bias, n, cols, relu);
}

void launch_softmax_xent(const float* logits, const uint8_t* y, size_t n, size_t classes, float* delta,
                         double* loss_sum, unsigned long long* correct, cudaStream_t stream) {
  const size_t rows_per_block = threads / 32;
  const auto grid = static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block);
  softmax_xent<<<grid == 0 ? 1 : grid, threads, 0, stream>>>(logits, y, n, classes, delta, loss_sum, correct);
}

void launch_relu_mask(float* delta, const float* act, size_t count, cudaStream_t stream) {
  relu_mask<<<blocks_for(count), threads, 0, stream>>>(delta, act, count);
}

void launch_fill(float* x, float value, size_t count, cudaStream_t stream) {
  fill<<<blocks_for(count), threads, 0, stream>>>(x, value, count);
}

}  // namespace ashlar::gpu
