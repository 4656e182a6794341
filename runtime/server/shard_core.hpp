// The state machine of one server shard: its parameter range, version, optimizer
// state and the gradients buffered for the current round. The actor feeds it pushes and
// membership changes; the sync policy inside decides. Pure code, no CAF.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "runtime/optim/sgd.hpp"
#include "runtime/policy/sync_policy.hpp"
#include "runtime/tensor/layout.hpp"
#include "runtime/wire/shared_tensor.hpp"

namespace ashlar {

/// What happened to one push.
struct push_outcome {
  push_decision::kind_t kind = push_decision::apply;
  /// The shard's version after the push was handled.
  uint64_t version = 0;
  uint64_t staleness = 0;
  /// True if this push completed a round (or was applied alone) and bumped the version.
  bool version_bumped = false;
};

/// Running counters of one shard.
struct shard_counters {
  uint64_t pushes = 0;
  uint64_t applied = 0;    // gradients that went into an update
  uint64_t dropped = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
  uint64_t samples = 0;    // the samples of the gradients that went into updates (a push cut short: its share)
};

class shard_core {
public:
  /// `params` must hold range.size() floats.
  shard_core(shard_range range, std::vector<float> params, sgd_config opt,
             std::unique_ptr<sync_policy> policy);

  const shard_range& range() const { return range_; }
  uint64_t version() const { return version_; }
  /// The current parameters, read where they lie (hold shared_params() to keep them).
  wire::float_view params() const { return {params_.get(), range_.size()}; }
  /// The current parameters as an immutable version that readers may hold while the
  /// shard moves on: an update never writes a buffer someone still references (it
  /// copies first), so a held version stays exactly as it was read.
  wire::shared_tensor shared_params() const { return {params_, range_.size()}; }

  /// Where parameter versions live from now on: buffers of range().size() floats from
  /// `source` (the job's shared-memory arena of this process, so that co-located workers
  /// read a version in place, with no copy per version). A source that gives nothing
  /// (empty, a small range, a full arena) leaves them on the heap. The current version
  /// moves there at once (one copy). `reclaim`, when given, runs before an update would
  /// copy a version someone still references, to let go of references that are only
  /// bookkeeping (replies whose readers are done with them).
  using buffer_source = std::function<std::shared_ptr<float>(size_t n)>;
  void use_storage(buffer_source source, std::function<void()> reclaim = {});
  const std::vector<float>& velocity() const { return velocity_; }

  /// Keeps a running average of the parameters (train.average_epochs): after each
  /// update of `samples` training samples the average moves toward the new parameters by
  /// 1 - 0.5^(samples / h), h = min(half_life_samples, a tenth of the samples this shard
  /// has applied), so that early on, while the model moves fast, it does not lag. 0 (the
  /// default) keeps none. The average is what evaluations read (see average_copy); the
  /// workers train the parameters themselves.
  void keep_average(double half_life_samples);
  bool keeps_average() const { return average_half_life_ > 0; }
  /// A copy of the running average, or of the parameters where the shard keeps none.
  wire::shared_tensor average_copy() const;
  /// The running average itself (empty where the shard keeps none), and the samples it
  /// has taken in since it (re)started: what a checkpoint stores beside the parameters.
  const std::vector<float>& average() const { return average_; }
  uint64_t average_samples() const { return average_seen_; }
  const sync_policy& policy() const { return *policy_; }
  const shard_counters& counters() const { return counters_; }

  /// Adds a worker to the live set.
  void join(worker_id w);

  /// Removes a worker from the live set. Returns true if that completed the current
  /// round (its gradients were applied and the version bumped).
  bool leave(worker_id w);

  /// Handles a mean gradient of `n` floats from worker `w`, computed at `base_version`
  /// over `batch` samples. Fails with shape_mismatch if n != range().size(), with
  /// invalid_state if `w` is not live or base_version is in the future, and with
  /// invalid_argument if batch is 0.
  [[nodiscard]] expected<push_outcome> push(worker_id w, uint64_t base_version, uint32_t batch,
                                            const float* grad, size_t n);

  /// A push arriving in pieces (chunks of one gradient, in order): the policy decides at
  /// the first piece, as for a whole push, and each piece is then used as it arrives:
  /// applied in place (apply), written into the worker's slot of the round (buffer), or
  /// skipped (drop). The push counts (and a version is bumped) when its last piece has
  /// arrived. While a push is being applied piece by piece, applying() is true and
  /// readers must wait: the parameters are not a version until it ends.
  /// begin_push fails like push(); a worker that begins a new push before ending its
  /// last has the last one ended as it stands.
  [[nodiscard]] expected<push_outcome> begin_push(worker_id w, uint64_t base_version, uint32_t batch,
                                                  size_t n);
  /// The next piece of `w`'s push: `n` floats at `offset`, which must be where the last
  /// piece ended (shape_mismatch otherwise, or past the range; invalid_state if `w` has no
  /// push begun). Returns the outcome, with version_bumped when this piece completed it.
  [[nodiscard]] expected<push_outcome> push_piece(worker_id w, uint64_t offset, const float* grad, size_t n);

  /// True while some push is applied piece by piece (see begin_push).
  bool applying() const { return applying_ > 0; }

  /// Retunes the policy (see sync_policy::tune).
  void tune(uint32_t k, bool async) { policy_->tune(k, async); }

  /// Moves the policy's staleness bound (see sync_policy::set_staleness_bound).
  void set_staleness_bound(uint64_t s) { policy_->set_staleness_bound(s); }

  /// Scales the learning rate of every update from now on (a training stage's). Default: 1.
  void set_lr_scale(float s) { stage_lr_scale_ = s; }

  /// Scales the learning rate of every update from now on by the schedule's factor
  /// (train.lr_schedule), on top of the stage's. Default: 1.
  void set_schedule_scale(float s) { schedule_lr_scale_ = s; }
  float lr_scale() const { return stage_lr_scale_ * schedule_lr_scale_; }

  /// Takes up a checkpointed state: `version`, its parameters, optimizer velocity and
  /// running average with the samples it has seen (range-sized; an empty velocity means
  /// none, an empty average that the average starts again from the parameters). Fails
  /// with shape_mismatch otherwise. A shard that keeps no average ignores `average`.
  [[nodiscard]] caf::error restore(uint64_t version, std::vector<float> params, std::vector<float> velocity,
                                   std::vector<float> average = {}, uint64_t average_samples = 0);
  /// True if worker `w` may read the parameters now.
  bool may_read(worker_id w) const { return policy_->may_read(w, version_); }

private:
  bool maybe_apply_round();
  // The running average's step after a version of `samples` samples (keep_average).
  void note_update(uint64_t samples);
  // The parameters, ready to be updated in place: a copy in a buffer nobody else holds
  // if a reader still references the current one.
  float* writable_params();

  struct pending {
    uint32_t batch = 0;
    std::vector<float> grad;
  };
  // A push between its first and last piece.
  struct inflight {
    push_decision decision;
    pending slot;          // buffer: the gradient as it arrives
    uint64_t received = 0; // floats so far
    uint64_t step = 0;     // apply: the optimizer's update number its pieces take
  };
  // Ends `w`'s push in flight, whole or not: applied pieces make a version, a buffered
  // gradient joins the round. Returns true if a version was bumped.
  bool end_push(worker_id w);
  // A buffer of range_.size() floats for a version from the storage source (nullptr: none
  // given), and one from it or else the heap.
  std::shared_ptr<float> stored_buffer() const;
  std::shared_ptr<float> new_buffer() const;

  shard_range range_;
  buffer_source storage_;
  std::function<void()> reclaim_;
  std::shared_ptr<float> params_;
  std::shared_ptr<float> spare_; // the previous version, reused once unreferenced
  std::vector<float> velocity_; // SGD's velocity, Adam's first moment
  std::vector<float> second_;   // Adam's second moment (empty under sgd)
  uint64_t steps_ = 0;          // updates applied (Adam's bias correction)
  // One update of the optimizer to [offset, +n) of the range.
  void apply_update(float lr_scale, size_t offset, const float* grad, size_t n, uint64_t step);
  double average_half_life_ = 0; // samples; 0: no running average
  uint64_t average_seen_ = 0;    // samples applied since the average (re)started
  std::vector<float> average_;
  sgd_config opt_;
  float stage_lr_scale_ = 1.0f;
  float schedule_lr_scale_ = 1.0f;
  std::unique_ptr<sync_policy> policy_;
  uint64_t version_ = 0;
  // Ordered by worker id, then arrival: a fixed summation order. A worker may have several
  // gradients in one round under policies that do not make it wait (k-async).
  std::multimap<worker_id, pending> round_;
  std::vector<float> acc_;
  // Gradient buffers of applied rounds, for the next pushes: a fresh one each push cost
  // a page fault per 4 KB (a 20M-parameter model's 80 MB: about as long as its update).
  std::vector<std::vector<float>> free_buffers_;
  std::map<worker_id, inflight> inflight_;
  uint32_t applying_ = 0;  // pushes in inflight_ being applied in place
  uint32_t buffering_ = 0; // pushes in inflight_ headed for the round
  shard_counters counters_;
};

}  // namespace ashlar
