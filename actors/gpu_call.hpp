// The messages of a GPU actor, for the few files that talk to one directly: the GPU
// actor itself (actors/gpu_actor.cpp) and the worker, which sends its training steps as
// requests (the worker's actor then waits for the reply without holding a thread).
#pragma once

#include <string>

#include <caf/all.hpp>

#include "runtime/backend/compute_backend.hpp"
#include "runtime/model/model.hpp"

namespace ashlar::actors {

// A compute call to a GPU actor. Local only: it carries the caller's pointers, which stay
// valid because the caller waits for the reply before it touches them again (a worker's
// await holds back even its exit until the reply).
// local_step, take_commit and rebase are compute_backend's calls of the same names
// (params: the model to load, or the pulled one; grad: the commit's output).
struct gpu_call {
  enum kind_t : uint8_t { prepare, train, evaluate, local_step, take_commit, rebase };
  kind_t kind = prepare;
  /// The model, and the text the GPU actor keeps its backend for it under (model_key):
  /// the caller's, made once, not per call.
  const model_spec* spec = nullptr;
  const std::string* model = nullptr;
  const float* params = nullptr;
  batch_view batch;
  float* grad = nullptr;
  const float* velocity = nullptr;
  const float* commit = nullptr;
  float* velocity_out = nullptr;
  float lr = 0, momentum = 0, scale = 1;
};

struct gpu_reply {
  batch_stats stats;
  caf::error err;
  std::string name; // the backend's, with the device's name
  bool keeps_model = false; // the backend keeps local models (and the pool lets it)
};

}  // namespace ashlar::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ashlar::actors::gpu_call)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ashlar::actors::gpu_reply)

namespace ashlar::actors {

using gpu_actor = caf::typed_actor<caf::replies_to<gpu_call>::with<gpu_reply>>;

/// The text a GPU actor keeps its backend for `spec` under: one per model.
std::string model_key(const model_spec& spec);

/// Where a backend a gpu_pool handed out computes: its GPU actor, and its model and the
/// model's key for gpu_call (they live as long as the backend). All null for any other
/// backend.
struct gpu_route {
  const gpu_actor* actor = nullptr;
  const model_spec* spec = nullptr;
  const std::string* model = nullptr;
};
gpu_route route_of(const compute_backend& backend);

}  // namespace ashlar::actors
