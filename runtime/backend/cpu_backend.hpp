// The CPU compute backend, built on OpenBLAS's SGEMM.
#pragma once

#include <memory>

#include "runtime/backend/compute_backend.hpp"

namespace ashlar {

/// A CPU backend for `spec`. Not thread-safe: one per worker. Its workspace grows to
/// the largest batch it has seen and is reused.
std::unique_ptr<compute_backend> make_cpu_backend(const mlp_spec& spec);

/// Sets the number of threads OpenBLAS uses in this process (it is process-wide).
/// Ashlar runs one worker per core, so the default it applies is 1.
void set_blas_threads(int n);

}  // namespace ashlar
