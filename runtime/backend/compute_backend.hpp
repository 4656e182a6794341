// The compute backend interface: one training step (forward, backward, gradient) and
// evaluation of a model (runtime/model/model.hpp) over a batch. The CPU backend (OpenBLAS)
// computes every layer kind, the GPU backend (cuBLAS) the models it supports; a host
// application may implement it for a model of its own (an `external` layer) and hand it
// to its workers (worker_config::make_backend, join_options::make_backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/model/model.hpp"

namespace ashlar {

/// A batch of samples: `n` rows of `dim` floats, row-major (each sample C x H x W in
/// channel-major order when the model's input is shaped), and one label per row.
/// The memory belongs to the caller and must outlive the call.
struct batch_view {
  const float* x = nullptr;
  const uint8_t* y = nullptr;
  size_t n = 0;
  size_t dim = 0;
};

/// Loss summed over the batch and the number of correct predictions.
struct batch_stats {
  double loss_sum = 0;
  size_t correct = 0;
  size_t n = 0;
  /// The backend took a batch of its own (a script's DataLoader): `n` is its size, 0 for a
  /// step that trained nothing (a script waiting for its peers), not the batch it was given.
  bool own_batch = false;
  /// Named metrics the backend's script reported with this step (its evaluation's
  /// "val_ppl"): they go to the job with the step's report.
  std::vector<std::pair<std::string, double>> metrics;
  double mean_loss() const { return n ? loss_sum / static_cast<double>(n) : 0.0; }
  double accuracy() const { return n ? static_cast<double>(correct) / static_cast<double>(n) : 0.0; }
};

class compute_backend {
public:
  virtual ~compute_backend();

  /// "cpu" or "cuda:N".
  virtual const char* name() const = 0;

  /// The model this backend computes.
  virtual const model_spec& spec() const = 0;

  /// How it computes the model, once it has (e.g. the kernels it chose per layer and
  /// why); empty if there is nothing to say.
  virtual std::string details() const;

  /// Computes the mean gradient of the loss over `batch` at `params` into `grad`
  /// (both spec().num_params() floats, laid out as compile(spec()) says). Fails with shape_mismatch if the batch's
  /// width differs from the model's input or a label is out of range, and with
  /// numerical_error if the loss is not finite. Blocks for the duration of the compute.
  [[nodiscard]] virtual expected<batch_stats> train_step(const float* params, batch_view batch,
                                                         float* grad) = 0;

  /// Forward pass only: loss and accuracy of `params` over `batch` (any size).
  [[nodiscard]] virtual expected<batch_stats> evaluate(const float* params, batch_view batch) = 0;

  /// Page-locks `bytes` of host memory at `p` for the life of the returned handle, where
  /// this backend moves data faster from and to such memory (a GPU's DMA), so that a
  /// caller can lock the parameter and gradient buffers it passes every step. Null where
  /// that gains nothing (the CPU) or the memory cannot be locked; calls work either way.
  /// `p` must outlive the handle.
  virtual std::shared_ptr<void> lock_host_memory(void* p, size_t bytes);
  /// Gives back the memory a step works in (activations and their gradients); the next
  /// step takes it again. For workers that share a node's cores many to a core, where
  /// only those computing need it. Default: nothing.
  virtual void release_scratch();

  // -- a local model the backend keeps --------------------------------------------------
  // Under local steps (adsp, ashl) a worker's model moves by each step's update between
  // commits. A backend that keeps that model itself (a GPU, in its memory) takes no
  // parameters in and gives no gradient out between commits: the worker sends the model
  // after each pull and takes the commit's sum at each commit. The arithmetic is
  // runtime/optim/local_steps.hpp's. Backends that do not keep a model (the default)
  // answer invalid_state to these calls.

  /// Whether local_step, take_commit and rebase work here.
  virtual bool keeps_local_model() const;

  /// One local step on the kept model. With `load` (a worker's first step, or its first
  /// after a pull), the model becomes `load` first, the open commit `commit` (null:
  /// empty) and the velocity `velocity` (null: the kept one stays). The gradient of
  /// `batch` at the kept model gives the update (with `momentum` > 0: velocity = momentum
  /// * velocity + gradient), which is added to the open commit and moves the model by
  /// -lr * update. A loss that is not finite fails with numerical_error, zeroes the
  /// velocity and changes nothing else.
  [[nodiscard]] virtual expected<batch_stats> local_step(const float* load, const float* velocity,
                                                         const float* commit, batch_view batch, float lr,
                                                         float momentum);

  /// Closes the open commit: `out` (spec().num_params() floats) = its sum * scale, and the
  /// next commit starts empty. With `velocity_out`, the velocity is copied there too. With
  /// `out` null, only the velocity is copied (the open commit stays).
  [[nodiscard]] virtual caf::error take_commit(float* out, float scale, float* velocity_out);

  /// An overlapped commit's pull has landed: the kept model becomes `pulled` - lr * (the
  /// open commit, the local steps made since the commit was taken).
  [[nodiscard]] virtual caf::error rebase(const float* pulled, float lr);
};

/// Checks a batch against a model: width, non-empty, labels in range.
[[nodiscard]] caf::error check_batch(const model_spec& spec, batch_view batch);

}  // namespace ashlar
