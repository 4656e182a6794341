// The CUDA backend for models described by layers (internal to gpu/; users call
// make_cuda_backend, which takes this one for every model that is not a plain MLP).
#pragma once

#include <memory>

#include "gpu/cuda_backend.hpp"

namespace ashlar::gpu {

/// A backend computing `spec` node by node on `device` (the device must exist). Fails
/// with invalid_config if the model does not compile and unknown_name for an external layer.
[[nodiscard]] expected<std::unique_ptr<compute_backend>> make_cuda_model_backend(const model_spec& spec, int device,
                                                                                 cuda_options options);

}  // namespace ashlar::gpu
