// How much memory a job may take on this machine, checked before it starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// The memory available to new allocations now, in bytes: MemAvailable in /proc/meminfo,
/// or less where this process's cgroup limits it (cgroup_memory_room); 0 where neither
/// can be read.
uint64_t available_memory_bytes();

/// Room left under the memory limits of the cgroup this process is in and its ancestors,
/// the least of them: cgroup v2 memory.max less memory.current, or v1
/// memory.limit_in_bytes less memory.usage_in_bytes. Read beneath `root` ("/" on a
/// machine; a test passes a directory laid out the same way). nullopt where no limit is
/// set or nothing can be read.
std::optional<uint64_t> cgroup_memory_room(const std::string& root = "/");

/// Worker slots a node offers at most unless its operator says more (`ashlar node
/// --oversubscribe`): 64 per core and one per 32 MiB of available memory, the smaller
/// (`available` 0: unknown, cores only); at least 1.
uint32_t host_slot_limit(unsigned cores, uint64_t available);

/// Asks the kernel to back the 2 MiB-aligned part of [p, p + bytes) with huge pages now
/// (MADV_HUGEPAGE, then MADV_COLLAPSE where the kernel has it): a large buffer that is
/// copied whole every step (a shard's parameters, read by every pull) then costs one
/// page-table walk per 2 MiB, not per 4 KiB. A hint: nothing happens below 4 MiB or
/// where the kernel declines.
void prefer_huge_pages(const void* p, size_t bytes);

/// Refuses a job whose model copies would not fit: `params` floats held `copies` times
/// (the shards' parameters and optimizer state, each local worker's parameters,
/// gradients and commits) against `available` bytes (0: unknown, not checked). Fails
/// with invalid_config naming the model, the estimate and what is available.
[[nodiscard]] caf::error check_model_memory(uint64_t params, uint64_t copies, uint64_t available,
                                            const std::string& model);

}  // namespace ashlar
