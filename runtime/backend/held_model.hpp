// A backend that keeps a worker's local model in host memory around another backend's
// training steps: the reference for backends that keep it on a device (compute_backend's
// local_step, take_commit, rebase), with the step machine's own arithmetic
// (runtime/optim/local_steps.hpp), so a worker whose backend keeps the model trains
// exactly as one that keeps it itself. Emulated GPU actors use it, which tests the
// worker's path of a GPU that keeps the model on machines without one.
#pragma once

#include <memory>

#include "runtime/backend/compute_backend.hpp"

namespace ashlar {

/// `inner` computes the gradients; the result keeps the local model. `inner` must not be null.
std::unique_ptr<compute_backend> hold_local_model(std::unique_ptr<compute_backend> inner);

}  // namespace ashlar
