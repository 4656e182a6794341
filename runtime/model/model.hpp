// A model described as an ordered list of layers over shaped samples (C, H, W), compiled
// to one flat float parameter vector (the vector the server shards split) and a plan that
// backends execute. `model.hidden` is the short form of an MLP: it expands to flatten,
// dense + relu per hidden width, and a dense output layer, with the same parameter layout
// and initial values the MLP always had, so every existing config and checkpoint works.
//
// Text form (config key model.layers, the job's wire form, the job record): layers
// separated by ';' or newlines, each "KIND key=value ...", for example
//   conv2d out=32 kernel=5 padding=2; relu; maxpool kernel=2; flatten; dense out=10
// Kinds and their keys (defaults in brackets):
//   dense      out                      weight [out x in] then bias [out]; needs a flat input
//   conv2d     out kernel [3] stride [1] padding [0]
//                                        weight [out x in_c x k x k] then bias [out]
//   maxpool    kernel [2] stride [kernel] padding [0]
//   avgpool    kernel [2] stride [kernel] padding [0]   (padding counts in the divisor)
//   relu, flatten
//   dropout    p [0.5]                   scaled by 1/(1-p) in training, identity in evaluation
//   groupnorm  groups [1] eps [1e-5]     per-sample, per-group statistics; gamma [C], beta [C];
//                                        keeps no running state, so nothing is shared
//                                        between workers but the parameters
//   layernorm  eps [1e-5]                groupnorm with one group
//   add        from                      adds the output of the earlier layer named `from`
//                                        (a residual connection; shapes must match)
//   external   params out [classes]      a layer the host application's own backend computes
//                                        (see compute_backend): `params` floats, output [out]
// Every layer also takes name=NAME (default: KIND + its index, e.g. conv2d0) and
// input=NAME (default: the previous layer's output), so a projection shortcut is written
//   conv2d name=proj input=block_in out=64 kernel=1 stride=2; add from=proj
// The last layer's output must be [classes]; the loss is softmax cross-entropy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/model/mlp.hpp"

namespace ashlar {

/// The shape of one sample: channels, height, width. A flat vector of n is {n, 1, 1}.
struct tensor_shape {
  uint32_t c = 1;
  uint32_t h = 1;
  uint32_t w = 1;
  uint64_t size() const { return uint64_t{c} * h * w; }
  bool flat() const { return h == 1 && w == 1; }
  /// "1x28x28", or "784" for a flat shape.
  std::string to_string() const;
  friend bool operator==(const tensor_shape& a, const tensor_shape& b) {
    return a.c == b.c && a.h == b.h && a.w == b.w;
  }
  friend bool operator!=(const tensor_shape& a, const tensor_shape& b) { return !(a == b); }
};

enum class layer_kind : uint8_t {
  dense,
  conv2d,
  maxpool,
  avgpool,
  relu,
  flatten,
  dropout,
  groupnorm,
  add,
  external,
};

/// The name of a kind as the text form writes it ("conv2d"); layernorm is groupnorm.
const char* to_string(layer_kind k);

/// One layer as the configuration describes it. Unused fields keep their defaults.
struct layer_spec {
  layer_kind kind = layer_kind::relu;
  /// Unique within the model; empty: KIND + index.
  std::string name;
  /// The earlier layer whose output this one takes; empty: the previous layer's.
  std::string input;
  /// dense, conv2d, external: output features / channels. Default: 0 (external: classes).
  uint32_t out = 0;
  /// conv2d, pools: square kernel side. Default: 3 (conv2d), 2 (pools).
  uint32_t kernel = 0;
  /// conv2d, pools: stride. Default: 1 (conv2d), the kernel (pools).
  uint32_t stride = 0;
  /// conv2d, pools: zero padding on each side. Default: 0.
  uint32_t padding = 0;
  /// groupnorm: groups the channels are split into. Default: 1.
  uint32_t groups = 1;
  /// dropout: probability of zeroing an activation. Default: 0.5.
  double p = 0.5;
  /// groupnorm: added to the variance. Default: 1e-5.
  double eps = 1e-5;
  /// add: the earlier layer whose output is added.
  std::string from;
  /// external: number of parameters. Default: 0.
  uint64_t params = 0;
  /// True when written as layernorm (text form only).
  bool layernorm = false;
};

/// A model: input shape, classes, and either the MLP short form (`hidden`) or a list of
/// layers. The loss is softmax cross-entropy over `classes` outputs.
struct model_spec {
  /// Shape of one input sample (model.input). Default: 1x28x28 (Fashion-MNIST).
  tensor_shape input{1, 28, 28};
  /// Output classes (model.classes). Default: 10.
  uint32_t classes = 10;
  /// MLP short form (model.hidden), used when `layers` is empty. Default: {256, 128}.
  std::vector<uint32_t> hidden = {256, 128};
  /// The layers (model.layers); empty: the MLP of `hidden`. Default: empty.
  std::vector<layer_spec> layers;

  /// The layers in force: `layers`, or the MLP expansion of `hidden`; names filled in.
  std::vector<layer_spec> resolved() const;
  /// Parameters of the compiled model (0 if it does not compile).
  uint64_t num_params() const;
  /// Short human-readable form: "784-256-128-10" for an MLP, else "1x28x28 conv2d-relu-...-dense (N params)".
  std::string to_string() const;
  /// True when the model is the MLP short form (or the layers are exactly such an MLP).
  std::optional<mlp_spec> as_mlp() const;
};

/// The model of an existing MLP spec (the short form with its input as a flat vector
/// when the width is not 784).
model_spec from_mlp(const mlp_spec& mlp);

/// Parses the text form of a layer list (see the top of this file). Errors name the
/// layer's index and the bad key or value.
[[nodiscard]] expected<std::vector<layer_spec>> parse_layers(const std::string& text);

/// The canonical text form of a layer list; parse_layers(layers_text(x)) gives x back.
std::string layers_text(const std::vector<layer_spec>& layers);

/// One layer of a compiled model.
struct plan_node {
  layer_spec spec;                 // names filled in
  int input = -1;                  // node index of the input; -1: the model's input
  int from = -1;                   // add: node index of the second operand
  tensor_shape in;                 // shape of the input
  tensor_shape out;                // shape of the output
  uint64_t weight = 0;             // offset of the weight (dense, conv2d) or gamma (groupnorm)
  uint64_t weight_size = 0;
  uint64_t bias = 0;               // offset of the bias or beta
  uint64_t bias_size = 0;
  uint64_t fan_in = 0;             // dense, conv2d: inputs per output (He initialization)
  uint64_t param_count() const { return weight_size + bias_size; }
};

/// A model compiled: its nodes in execution order and the parameter count.
struct model_plan {
  tensor_shape input;
  uint32_t classes = 0;
  std::vector<plan_node> nodes;
  uint64_t num_params = 0;
  /// Largest per-sample activation, in floats (sizing buffers).
  uint64_t widest = 0;
  /// Sum of every node's per-sample output, in floats.
  uint64_t activation_floats = 0;
  bool has_external() const;
  /// For a backend that runs the nodes in order and keeps every node's output for the
  /// backward pass: the node whose buffers hold node i's output (a flatten, or a dropout
  /// with p = 0, shares its input's unless it is the last node; -1: the batch itself).
  std::vector<int> output_owners() const;
  /// Whether node i's output gradient is needed: parameters lie upstream of it.
  std::vector<bool> gradients_needed() const;
};

/// Compiles a model: resolves names and inputs, infers every shape and lays the
/// parameters out. A layer that does not fit its input fails with invalid_config in one
/// line naming the layer, its index, its input shape and what it needs, e.g.
/// "model.layers[3] 'dense3': dense needs a flat input, got 32x7x7 (add flatten before it)".
[[nodiscard]] expected<model_plan> compile(const model_spec& spec);

/// Checks the model (compiles it). Names the bad key or layer.
[[nodiscard]] caf::error validate(const model_spec& spec);

/// For a backend that cannot compute external layers (`backend` names it, e.g. "the CPU
/// backend"): unknown_name naming the plan's first external layer, or none.
[[nodiscard]] caf::error refuse_external(const model_plan& plan, const std::string& backend);

/// Initial parameters: He-normal weights for dense and conv2d (std sqrt(2 / fan_in)),
/// zero biases, groupnorm gamma 1 and beta 0, external layers N(0, 0.01^2); drawn in layer
/// order from one generator seeded with `seed`. For the MLP short form the bits are
/// those of init_params(mlp_spec, seed). Empty if the model does not compile.
std::vector<float> init_params(const model_spec& spec, uint64_t seed);

}  // namespace ashlar
