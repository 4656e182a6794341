// The CUDA compute backend: the compute_backend interface on one NVIDIA GPU, with
// cuBLAS SGEMM for the layers and CUDA kernels for bias, ReLU and softmax cross-entropy.
//
// This header needs no CUDA: a build without the toolkit (ASHLAR_ENABLE_CUDA=OFF, or
// AUTO with none found) compiles gpu/no_cuda.cpp instead, where list_devices() says so
// and make_cuda_backend() fails with the reason, and everything runs on the CPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/compute_backend.hpp"
#include "runtime/core/error.hpp"
#include "runtime/model/mlp.hpp"

namespace ashlar::gpu {

/// Whether this build has the CUDA backend.
bool built_with_cuda();

struct device_info {
  int index = 0;
  std::string name;
  size_t memory = 0; // bytes
  int major = 0, minor = 0; // compute capability
  int multiprocessors = 0;
};

/// The CUDA devices this process can use. An error (device_error) says why there are
/// none: a build without CUDA, no driver, no device.
[[nodiscard]] expected<std::vector<device_info>> list_devices();

struct cuda_options {
  /// Let cuBLAS use TF32 tensor cores for the float32 products (about 1e-3 relative
  /// error instead of float32's 1e-6; much faster on Ampere and later).
  bool tf32 = false;
};

/// A backend owning `device`: its stream, cuBLAS handle, device buffers and pinned
/// host buffers. Not thread-safe: one caller at a time (the GPU actor serializes).
[[nodiscard]] expected<std::unique_ptr<compute_backend>> make_cuda_backend(const mlp_spec& spec, int device,
                                                                           cuda_options options = {});

/// One cuBLAS SGEMM: C (m x n) = op(A) op(B), column-major, op = transpose when set.
struct gemm_shape {
  bool transpose_a = false, transpose_b = false;
  int m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * m * n * k; }
};

/// The products of one training step of `spec` on `rows` samples, as the CUDA backend
/// issues them (forward, weight gradients, input gradients).
std::vector<gemm_shape> step_gemms(const mlp_spec& spec, int rows);

/// Seconds cuBLAS alone takes for `shapes` back to back on `device` (random operands,
/// median of `reps` timed runs after warm-up, timed with CUDA events).
[[nodiscard]] expected<double> time_gemms(const std::vector<gemm_shape>& shapes, int device, bool tf32, int reps);

}  // namespace ashlar::gpu
