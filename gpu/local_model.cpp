#include "gpu/local_model.hpp"

#include <cstring>

#include "gpu/kernels.hpp"

namespace ashlar::gpu::detail {

caf::error copy_to_host(float* dst, const float* src, size_t count, pinned_buffer<float>& staging,
                        cudaStream_t stream) {
  const size_t bytes = count * sizeof(float);
  const bool direct = page_locked(dst);
  if (!direct)
    if (auto err = staging.resize(count))
      return err;
  ASHLAR_CUDA(cudaMemcpyAsync(direct ? dst : staging.p, src, bytes, cudaMemcpyDeviceToHost, stream));
  ASHLAR_CUDA(cudaStreamSynchronize(stream));
  if (!direct)
    std::memcpy(dst, staging.p, bytes);
  return caf::none;
}

caf::error copy_to_device(float* dst, const float* src, size_t count, pinned_buffer<float>& staging,
                          cudaStream_t stream) {
  const size_t bytes = count * sizeof(float);
  if (!page_locked(src)) {
    if (auto err = staging.resize(count))
      return err;
    std::memcpy(staging.p, src, bytes);
    src = staging.p;
  }
  ASHLAR_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  return caf::none;
}

caf::error device_local_model::reserve(size_t count, cudaStream_t stream) {
  if (count_ == count)
    return caf::none;
  if (auto err = velocity_.resize(count))
    return err;
  if (auto err = acc_.resize(count))
    return err;
  count_ = count;
  ASHLAR_CUDA(cudaMemsetAsync(velocity_.p, 0, count * sizeof(float), stream));
  ASHLAR_CUDA(cudaMemsetAsync(acc_.p, 0, count * sizeof(float), stream));
  return caf::none;
}

caf::error device_local_model::load(const float* velocity, const float* commit, cudaStream_t stream) {
  if (velocity) {
    if (auto err = copy_to_device(velocity_.p, velocity, count_, staging_, stream))
      return err;
    ASHLAR_CUDA(cudaStreamSynchronize(stream)); // the staging buffer is free again
  }
  if (commit) {
    if (auto err = copy_to_device(acc_.p, commit, count_, staging_, stream))
      return err;
    ASHLAR_CUDA(cudaStreamSynchronize(stream));
  } else {
    ASHLAR_CUDA(cudaMemsetAsync(acc_.p, 0, count_ * sizeof(float), stream));
  }
  return caf::none;
}

caf::error device_local_model::zero_velocity(cudaStream_t stream) {
  ASHLAR_CUDA(cudaMemsetAsync(velocity_.p, 0, count_ * sizeof(float), stream));
  return caf::none;
}

caf::error device_local_model::update(float* params, const float* grad, float lr, float momentum,
                                      cudaStream_t stream) {
  launch_local_update(params, velocity_.p, acc_.p, grad, count_, lr, momentum, stream);
  ASHLAR_LAUNCHED();
  return caf::none;
}

caf::error device_local_model::take(float* out, float scale, float* velocity_out, float* scratch,
                                    cudaStream_t stream) {
  if (out) {
    launch_take(scratch, acc_.p, scale, count_, stream);
    ASHLAR_LAUNCHED();
    if (auto err = copy_to_host(out, scratch, count_, staging_, stream))
      return err;
  }
  if (velocity_out)
    return copy_to_host(velocity_out, velocity_.p, count_, staging_, stream);
  return caf::none;
}

caf::error device_local_model::rebase(float* params, float lr, cudaStream_t stream) {
  launch_rebase(params, acc_.p, lr, count_, stream);
  ASHLAR_LAUNCHED();
  return caf::none;
}

}  // namespace ashlar::gpu::detail
