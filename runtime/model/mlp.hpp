// A multi-layer perceptron: dense layers with ReLU between them and softmax
// cross-entropy on the output. Parameters live in one flat float vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// The shape of an MLP: input width, hidden widths, number of classes.
struct mlp_spec {
  /// Width of one input sample. Default: 784 (28x28 images).
  uint32_t input = 784;
  /// Widths of the hidden layers, in order. Default: {256, 128}.
  std::vector<uint32_t> hidden = {256, 128};
  /// Number of output classes. Default: 10.
  uint32_t classes = 10;

  /// Layer widths from input to output, e.g. {784, 256, 128, 10}.
  std::vector<uint32_t> widths() const;
  /// Number of dense layers.
  size_t num_layers() const { return hidden.size() + 1; }
  /// Total number of parameters (weights and biases).
  uint64_t num_params() const;
  /// Human-readable form, e.g. "784-256-128-10".
  std::string to_string() const;
};

/// Where one layer's weights and bias sit in the flat parameter vector.
/// Weights are [out x in], row-major, followed by the bias [out].
struct layer_offsets {
  uint32_t in = 0;
  uint32_t out = 0;
  uint64_t weight = 0;
  uint64_t bias = 0;
};

/// Offsets of every layer, in order.
std::vector<layer_offsets> layer_layout(const mlp_spec& spec);

/// Checks that every width is non-zero. Names the bad field.
[[nodiscard]] caf::error validate(const mlp_spec& spec);

/// Initial parameters: He-normal weights (std sqrt(2/in)), zero biases, drawn from a
/// generator seeded with `seed`: the same seed gives the same bits on every run.
std::vector<float> init_params(const mlp_spec& spec, uint64_t seed);

}  // namespace ashlar
