// Where large message buffers come from: a process-wide cache of freed blocks, so that the
// tensors a process receives every step (pushes on a shard, pull replies on a worker) land
// in memory that is already mapped instead of fresh pages (a page fault each 4 KiB costs
// more than the copy into it). Blocks of 4 MiB or more are also backed by huge pages where
// the kernel allows it.
#pragma once

#include <cstddef>

namespace ashlar::wire {

/// Buffers this large or larger go through the cache. 1 MiB.
constexpr size_t block_threshold = size_t{1} << 20;

/// A buffer of at least `bytes` (>= block_threshold): a cached block of the same size if
/// one is free, else a new one. Throws std::bad_alloc as operator new does.
void* take_block(size_t bytes);
/// Gives back a buffer from take_block(bytes). It is kept for the next take of its size
/// while the cache holds less than its bound (256 MiB) and freed once unused for 5 s.
void give_block(void* p, size_t bytes) noexcept;
/// Bytes held in the cache now (freed buffers kept for reuse).
size_t cached_block_bytes() noexcept;

}  // namespace ashlar::wire
