// Adaptive k-sync / k-async SGD: k, and whether late gradients are dropped (k-sync) or
// applied stale (k-async), chosen while training from each worker's recent iteration
// time and how far its gradients lag behind the shard's version.
//
// adaptive_k_planner decides (the scheduler runs it on the profiler's figures);
// adaptive_k_policy is the shard side, a k-sync or k-async policy whose k and mode the
// planner's choice retunes at round boundaries. Pure code: no CAF, no clocks.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/policy/job_planner.hpp"
#include "runtime/policy/k_sync.hpp"

namespace ashlar {

struct adaptive_k_config {
  /// A worker is waited for when its iteration time is within this factor of the
  /// fastest worker's. Default: 1.5.
  double wait_tolerance = 1.5;
  /// Late gradients are kept (k-async) while the workers' recent mean staleness is at
  /// most this many versions; beyond it they are dropped (k-sync). Default: 4.
  double max_staleness = 4.0;
};

/// One worker as the planner sees it.
struct worker_timing {
  worker_id id = 0;
  double iteration_s = 0; // recent iteration time without policy waits; 0 = unknown
};

struct adaptive_k_choice {
  uint32_t k = 0;
  bool async = false;
  bool operator==(const adaptive_k_choice& o) const { return k == o.k && async == o.async; }
};

class adaptive_k_planner {
public:
  explicit adaptive_k_planner(adaptive_k_config cfg = {}) : cfg_(cfg) {}

  /// k = the number of workers whose iteration time is within wait_tolerance of the
  /// fastest (at least 1; every worker when times are unknown or equal): waiting for
  /// them costs little, waiting for the rest would cost a round of their time.
  /// async = the recent mean staleness is within max_staleness.
  adaptive_k_choice choose(const std::vector<worker_timing>& workers, double recent_staleness) const;

private:
  adaptive_k_config cfg_;
};

/// Shard side: k-sync or k-async with k and the mode set by tune().
class adaptive_k_policy final : public sync_policy {
public:
  explicit adaptive_k_policy(policy_config cfg);
  const char* name() const override { return "adaptive"; }
  void on_join(worker_id w) override;
  void on_leave(worker_id w) override;
  push_decision on_push(worker_id w, uint64_t base_version, uint64_t version) override;
  bool round_ready() const override;
  void on_round_applied() override;
  bool may_read(worker_id w, uint64_t version) const override;
  const std::set<worker_id>& live() const override { return sync_.live(); }
  void tune(uint32_t k, bool async) override;
  void on_push_cut_short(worker_id w) override;

  bool async() const { return async_mode_; }
  size_t k() const { return async_mode_ ? async_.k() : sync_.k(); }

private:
  // Applies a pending tune() if nothing is buffered in the current round.
  void switch_if_idle();

  k_sync_policy sync_;
  k_async_policy async_;
  bool async_mode_ = false;
  bool pending_ = false;
  uint32_t pending_k_ = 0;
  bool pending_async_ = false;
  size_t buffered_ = 0; // gradients buffered in the current round
};

/// The adaptive policy's job planner: every tick, k and the mode from the live workers'
/// iteration times (without policy waits) and the staleness of the pushes since the last
/// tick (shard 0's counters); the shards retune at their next round boundary.
class adaptive_k_job_planner final : public job_planner {
public:
  explicit adaptive_k_job_planner(adaptive_k_config cfg = {}) : planner_(cfg) {}
  bool plans() const override { return true; }
  bool wants_staleness() const override { return true; }
  void on_tick(const planner_view& view, job_plan& out) override;
  shard_settings shard_state() const override;

private:
  adaptive_k_planner planner_;
  adaptive_k_choice tuned_; // as last sent
  uint64_t staleness_sum_ = 0, pushes_ = 0; // shard 0's counters at the last tick
};

}  // namespace ashlar
