// The state machine of one server shard: its parameter range, version, optimizer
// state and the gradients buffered for the current round. The actor feeds it pushes and
// membership changes; the sync policy inside decides. Pure code, no CAF.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "runtime/optim/sgd.hpp"
#include "runtime/policy/sync_policy.hpp"
#include "runtime/tensor/layout.hpp"

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
};

class shard_core {
public:
  /// `params` must hold range.size() floats.
  shard_core(shard_range range, std::vector<float> params, sgd_config opt,
             std::unique_ptr<sync_policy> policy);

  const shard_range& range() const { return range_; }
  uint64_t version() const { return version_; }
  const std::vector<float>& params() const { return params_; }
  const std::vector<float>& velocity() const { return velocity_; }
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

  /// Retunes the policy (see sync_policy::tune).
  void tune(uint32_t k, bool async) { policy_->tune(k, async); }

  /// True if worker `w` may read the parameters now.
  bool may_read(worker_id w) const { return policy_->may_read(w, version_); }

private:
  bool maybe_apply_round();

  struct pending {
    uint32_t batch = 0;
    std::vector<float> grad;
  };

  shard_range range_;
  std::vector<float> params_;
  std::vector<float> velocity_;
  sgd_config opt_;
  std::unique_ptr<sync_policy> policy_;
  uint64_t version_ = 0;
  // Ordered by worker id, then arrival: a fixed summation order. A worker may have several
  // gradients in one round under policies that do not make it wait (k-async).
  std::multimap<worker_id, pending> round_;
  std::vector<float> acc_;
  shard_counters counters_;
};

}  // namespace ashlar
