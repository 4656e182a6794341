// train.allocation's modes: how the global batch is split among the workers.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// equal: batch_size each; proportional: to speed profiled over the first steps, then
/// fixed; adaptive: re-split every tick from smoothed observed speed; predicted: from
/// each worker's next iteration time as a GRU predicts it.
enum class allocation_mode : uint8_t { equal, proportional, adaptive, predicted };

/// "equal", "proportional", "adaptive" or "predicted"; fails with invalid_config naming
/// train.allocation and the known modes.
[[nodiscard]] expected<allocation_mode> parse_allocation(const std::string& name);
const char* to_string(allocation_mode m);

}  // namespace ashlar
