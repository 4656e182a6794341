// What both CUDA backends share (internal to gpu/): the device, its compute stream (and
// the MLP's copy stream), the cuBLAS handle, the parameter, gradient, batch and loss
// buffers, a worker's kept local model, and the calls of compute_backend built on them.
// A backend supplies how it sizes its buffers, moves the parameters in, and runs forward
// and backward; train_step, evaluate, local_step, take_commit and rebase are the same
// sequence of those for both.
#pragma once

#include <memory>
#include <string>

#include "gpu/cuda_backend.hpp"
#include "gpu/local_model.hpp"

namespace ashlar::gpu::detail {

class backend_base : public compute_backend {
public:
  ~backend_base() override;

  const char* name() const override {
    return name_.c_str();
  }
  std::shared_ptr<void> lock_host_memory(void* p, size_t bytes) override;
  bool keeps_local_model() const override {
    return true;
  }

  expected<batch_stats> train_step(const float* params, batch_view b, float* grad) override;
  expected<batch_stats> evaluate(const float* params, batch_view b) override;
  /// A local step: the parameters go in only with `load` (after a pull), the gradient
  /// stays on the device and moves the kept model there.
  expected<batch_stats> local_step(const float* load, const float* velocity, const float* commit, batch_view b,
                                   float lr, float momentum) override;
  caf::error take_commit(float* out, float scale, float* velocity_out) override;
  caf::error rebase(const float* pulled, float lr) override;

protected:
  /// `num_params` parameters, samples of `input_floats`, `classes` outputs.
  backend_base(int device, cuda_options options, size_t num_params, size_t input_floats, size_t classes);

  /// Streams, cuBLAS handle, the parameter, gradient and loss buffers. Once, first. With
  /// `copy_stream`, transfers of the batch and the parameters go on a stream of their own
  /// (copy_, non-null; upload_batch marks the batch's arrival with batch_in_).
  caf::error init_device(bool copy_stream);
  /// Waits for the work in flight, if any: a derived backend's destructor calls it before
  /// its own buffers go.
  void drain();

  /// Buffers for batches of up to `n` samples: the batch's (x_, y_, their staging, ones_)
  /// and the layers' (reserve_layers).
  caf::error reserve(size_t n);
  virtual caf::error reserve_layers(size_t n) = 0;
  /// The parameters to the device; with `b`, the batch too.
  virtual caf::error upload(const float* params, const batch_view* b) = 0;
  /// The forward pass on the n samples in x_, into the logits; `training` draws dropout
  /// masks (a new step's).
  virtual caf::error forward(size_t n, bool training) = 0;
  /// The backward pass from the loss's gradient into grad_; with `out` (host memory,
  /// page-locked), the gradient leaves for it.
  virtual caf::error backward(size_t n, float* out) = 0;
  /// Samples evaluated at once.
  virtual size_t eval_chunk() const = 0;
  /// The last node's output, and where the loss's gradient goes.
  virtual float* logits() = 0;
  virtual float* logits_grad() = 0;

  /// The batch to x_ and y_ through the pinned staging buffers, on the copy stream where
  /// there is one. The staging buffers are free: every call ends with its streams drained.
  caf::error upload_batch(batch_view b);
  /// The loss and correct count, reduced on the device, copied out at finish().
  caf::error enqueue_loss(size_t n, bool grad);
  batch_stats read_loss(size_t n) const;
  /// Waits for the streams: the results are in host memory and the staging buffers free.
  caf::error finish();
  /// Makes the device current and waits for anything a call that failed half-way left in
  /// flight.
  caf::error begin();
  /// A call's start: the batch checked against the model, begin(), buffers for `rows`.
  caf::error start_call(batch_view b, size_t rows);

  int device_;
  cuda_options options_;
  size_t num_params_, input_floats_, classes_;
  size_t capacity_ = 0; // the batch the buffers hold
  std::string name_;
  cudaStream_t stream_ = nullptr, copy_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  device_buffer<float> params_, grad_, x_, ones_; // ones_: n ones, for bias gradients
  device_buffer<uint8_t> y_;
  device_buffer<double> totals_;
  device_buffer<unsigned long long> correct_;
  pinned_buffer<float> host_params_, host_grad_, host_x_;
  pinned_buffer<uint8_t> host_y_;
  pinned_buffer<double> host_totals_;
  pinned_buffer<unsigned long long> host_correct_;
  sync_event batch_in_;
  device_local_model local_;
};

}  // namespace ashlar::gpu::detail
