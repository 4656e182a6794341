// A worker's local model kept on the device (internal to gpu/): the velocity and open
// commit beside a backend's parameter and gradient buffers, for backend_base's
// local_step / take_commit / rebase (gpu/backend_base.hpp).
#pragma once

#include <cstddef>

#include "gpu/cuda_util.hpp"

namespace ashlar::gpu::detail {

/// Copies `count` floats from the device to `dst` on `stream` and waits: straight into
/// `dst` when it is page-locked, else through `staging` (grown as needed).
caf::error copy_to_host(float* dst, const float* src, size_t count, pinned_buffer<float>& staging,
                        cudaStream_t stream);
/// Copies `count` floats from `src` to the device on `stream` (not waiting): straight
/// from page-locked memory, else through `staging`, which stays in use until the stream
/// has drained.
caf::error copy_to_device(float* dst, const float* src, size_t count, pinned_buffer<float>& staging,
                          cudaStream_t stream);

class device_local_model {
public:
  /// Makes the velocity and the open commit for `count` parameters (zero), once.
  caf::error reserve(size_t count, cudaStream_t stream);
  /// With a model loaded: the velocity becomes `velocity` (host memory; null: the kept one
  /// stays) and the open commit `commit` (null: empty). Waits.
  caf::error load(const float* velocity, const float* commit, cudaStream_t stream);
  caf::error zero_velocity(cudaStream_t stream);
  /// The step's update from `grad` moves `params` and adds to the open commit.
  caf::error update(float* params, const float* grad, float lr, float momentum, cudaStream_t stream);
  /// out (host) = the open commit * scale, through `scratch` (a device buffer of
  /// `count`); the commit starts empty. With velocity_out, the velocity too; with `out`
  /// null, only that. Waits.
  caf::error take(float* out, float scale, float* velocity_out, float* scratch, cudaStream_t stream);
  /// params (holding the pulled model) -= lr * the open commit.
  caf::error rebase(float* params, float lr, cudaStream_t stream);

private:
  size_t count_ = 0;
  device_buffer<float> velocity_, acc_;
  pinned_buffer<float> staging_;
};

}  // namespace ashlar::gpu::detail
