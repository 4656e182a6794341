// The flattened parameter vector and its split into contiguous shard ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// A contiguous range [begin, end) of the flattened parameters, owned by one server shard.
struct shard_range {
  uint32_t shard_id = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  friend bool operator==(const shard_range& a, const shard_range& b) {
    return a.shard_id == b.shard_id && a.begin == b.begin && a.end == b.end;
  }
};

/// Splits `num_params` parameters into `num_shards` contiguous ranges whose sizes
/// differ by at most one, in shard-id order, covering every parameter exactly once.
/// Fails with invalid_config if num_shards is 0 or exceeds num_params.
[[nodiscard]] expected<std::vector<shard_range>> split_ranges(uint64_t num_params,
                                                             uint32_t num_shards);

}  // namespace ashlar
