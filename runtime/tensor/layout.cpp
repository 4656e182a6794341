#include "runtime/tensor/layout.hpp"

#include <string>

namespace ashlar {

expected<std::vector<shard_range>> split_ranges(uint64_t num_params, uint32_t num_shards) {
  if (num_shards == 0)
    return make_error(errc::invalid_config, "servers must be at least 1");
  if (num_shards > num_params)
    return make_error(errc::invalid_config,
                      "servers = " + std::to_string(num_shards) + " exceeds the model's "
                        + std::to_string(num_params)
                        + " parameters: every shard needs at least one parameter");
  std::vector<shard_range> out;
  out.reserve(num_shards);
  uint64_t base = num_params / num_shards;
  uint64_t extra = num_params % num_shards;
  uint64_t pos = 0;
  for (uint32_t i = 0; i < num_shards; ++i) {
    uint64_t len = base + (i < extra ? 1 : 0);
    out.push_back(shard_range{i, pos, pos + len});
    pos += len;
  }
  return out;
}

}  // namespace ashlar
