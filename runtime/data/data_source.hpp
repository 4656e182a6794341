// data.source: where a job's samples come from.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// fashion-mnist: Fashion-MNIST's IDX files; npy: the user's NumPy arrays (x_train.npy,
/// y_train.npy, x_test.npy, y_test.npy); synthetic: Gaussian clusters, for benchmarks.
enum class data_source_kind : uint8_t { fashion_mnist, npy, synthetic };

/// "fashion-mnist", "npy" or "synthetic"; fails with invalid_config naming data.source.
[[nodiscard]] expected<data_source_kind> parse_data_source(const std::string& name);
const char* to_string(data_source_kind k);

}  // namespace ashlar
