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
// valid because the caller waits for the reply before it touches them again.
struct gpu_call {
  enum kind_t : uint8_t { prepare, train, evaluate };
  kind_t kind = prepare;
  model_spec spec;
  const float* params = nullptr;
  batch_view batch;
  float* grad = nullptr;
};

struct gpu_reply {
  batch_stats stats;
  caf::error err;
  std::string name; // the backend's, with the device's name
};

}  // namespace ashlar::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ashlar::actors::gpu_call)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ashlar::actors::gpu_reply)

namespace ashlar::actors {

using gpu_actor = caf::typed_actor<caf::replies_to<gpu_call>::with<gpu_reply>>;

/// The GPU actor `backend` computes through (a backend a gpu_pool handed out), or null
/// for any other backend.
const gpu_actor* device_of(const compute_backend& backend);

}  // namespace ashlar::actors
