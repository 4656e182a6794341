// How much memory a job may take on this machine, checked before it starts.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// The memory available to new allocations now (MemAvailable in /proc/meminfo), in
/// bytes; 0 where it cannot be read.
uint64_t available_memory_bytes();

/// Worker slots a node offers at most unless its operator says more (`ashlar node
/// --oversubscribe`): 64 per core and one per 32 MiB of available memory, the smaller
/// (`available` 0: unknown, cores only); at least 1.
uint32_t host_slot_limit(unsigned cores, uint64_t available);

/// Refuses a job whose model copies would not fit: `params` floats held `copies` times
/// (the shards' parameters and optimizer state, each local worker's parameters,
/// gradients and commits) against `available` bytes (0: unknown, not checked). Fails
/// with invalid_config naming the model, the estimate and what is available.
[[nodiscard]] caf::error check_model_memory(uint64_t params, uint64_t copies, uint64_t available,
                                            const std::string& model);

}  // namespace ashlar
