// How much memory a job may take on this machine, checked before it starts.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// The memory available to new allocations now (MemAvailable in /proc/meminfo), in
/// bytes; 0 where it cannot be read.
uint64_t available_memory_bytes();

/// Refuses a job whose model copies would not fit: `params` floats held `copies` times
/// (the shards' parameters and optimizer state, each local worker's parameters,
/// gradients and commits) against `available` bytes (0: unknown, not checked). Fails
/// with invalid_config naming the model, the estimate and what is available.
[[nodiscard]] caf::error check_model_memory(uint64_t params, uint64_t copies, uint64_t available,
                                            const std::string& model);

}  // namespace ashlar
