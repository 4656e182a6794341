// Benchmark timers for one GPU: a training step's compute, host-device copies, and
// cuBLAS alone on a step's products (`ashlar bench gpu`). Kept apart from the backend's
// factory: workers never call them. Defined in cuda_backend.cpp (no_cuda.cpp without the
// toolkit, where each says there is no GPU).
#pragma once

#include <vector>

#include "gpu/cuda_backend.hpp"

namespace ashlar::gpu {

/// Seconds one training step's compute (forward, loss, backward; no transfers) takes on
/// `device` for `rows` samples of `spec`, random data: median of `reps` after warm-up,
/// timed with CUDA events.
[[nodiscard]] expected<double> time_step_compute(const mlp_spec& spec, size_t rows, int device,
                                                 cuda_options options, int reps);

/// Host-device copy rates in GB/s (1e9 bytes/s), from memory cudaMallocHost allocated
/// ("pinned") and from ordinary memory page-locked by lock_host ("locked", what workers use).
struct transfer_rates {
  double h2d_pinned = 0, d2h_pinned = 0, h2d_locked = 0, d2h_locked = 0;
};

/// Times copies of `bytes` each way on `device` (median of `reps` after warm-up, CUDA events).
[[nodiscard]] expected<transfer_rates> time_transfers(size_t bytes, int device, int reps);

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
