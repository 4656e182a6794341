// The CPU compute backend: every layer kind of runtime/model/model.hpp, dense products
// through OpenBLAS's SGEMM, convolutions through oneDNN or im2col + SGEMM per layer.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/backend/compute_backend.hpp"

namespace ashlar {

/// How the CPU backend computes conv2d layers: oneDNN's direct convolutions or im2col +
/// OpenBLAS GEMMs. `measure` (the default) times both on each layer at the first batch
/// and keeps the faster; details() says what it chose and the times.
enum class cpu_conv { measure, im2col, onednn };

/// A CPU backend for `spec`. Not thread-safe: one per worker. Its workspace grows to
/// the largest batch it has seen and is reused. Fails with invalid_config if the model
/// does not compile, and with unknown_name if it has an `external` layer (only the host
/// application's own backend computes those). Dropout masks come from `seed` (0: a
/// stream of the backend's own); the CUDA backend with the same seed draws the same.
[[nodiscard]] expected<std::unique_ptr<compute_backend>> make_cpu_backend(const model_spec& spec,
                                                                         cpu_conv conv = cpu_conv::measure,
                                                                         uint64_t seed = 0);

/// Same, for an MLP spec (aborts on a spec that does not validate: callers built it).
std::unique_ptr<compute_backend> make_cpu_backend(const mlp_spec& spec);

/// Sets the number of threads OpenBLAS uses in this process (it is process-wide).
/// Ashlar runs one worker per core, so the default it applies is 1.
void set_blas_threads(int n);

}  // namespace ashlar
