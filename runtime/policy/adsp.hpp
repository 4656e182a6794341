// ADSP (Hu, Wang, Wu, AAAI 2020): workers never wait. Each trains locally and commits its
// accumulated update at its own interval, chosen so that every worker commits about
// equally often; shards apply commits on arrival (asynchronously). The commit period is
// searched online from observed progress.
//
// The shard side is ASP's (adsp_policy); the planning is adsp_planner's, which the
// scheduler drives with the profiler's iteration times. Pure code: no CAF, no clocks.
#pragma once

#include <cstdint>
#include <map>

#include "runtime/policy/job_planner.hpp"
#include "runtime/policy/sync_policy.hpp"

namespace ashlar {

/// Shard side: every commit is applied on arrival; reads never wait.
class adsp_policy final : public sync_policy {
public:
  const char* name() const override { return "adsp"; }
  void on_join(worker_id w) override { live_.insert(w); }
  void on_leave(worker_id w) override { live_.erase(w); }
  push_decision on_push(worker_id w, uint64_t base_version, uint64_t version) override;
  bool round_ready() const override { return false; }
  void on_round_applied() override {}
  bool may_read(worker_id, uint64_t) const override { return true; }
  const std::set<worker_id>& live() const override { return live_; }

private:
  std::set<worker_id> live_;
};

struct adsp_config {
  /// Commit period the search starts from, seconds. Default: 0.2.
  double initial_period_s = 0.2;
  /// Bounds of the commit period, seconds. Default: 0.02 .. 5.
  double min_period_s = 0.02;
  double max_period_s = 5.0;
  /// Relative change of the period per search step. Default: 0.3 (30%).
  double step = 0.3;
  /// Momentum of the search direction, in [0, 1). Default: 0.5.
  double momentum = 0.5;
  /// Most local steps between two commits. Default: 64.
  uint32_t max_local_steps = 64;
};

/// Chooses each worker's local steps per commit and searches the commit period.
class adsp_planner {
public:
  explicit adsp_planner(adsp_config cfg = {});

  /// The commit period in force, seconds.
  double period() const { return period_; }

  /// Local steps per commit for each worker, given its recent iteration time in seconds
  /// (compute of one local step): round(period / t), at least 1 and at most
  /// max_local_steps. A worker with no time yet gets 1.
  std::map<worker_id, uint32_t> local_steps(const std::map<worker_id, double>& iteration_s) const;

  /// One observation of training progress: `loss` (lower is better) at `t_s` seconds.
  /// From the second observation on, compares the progress rate (loss drop per second)
  /// with the previous interval's and moves the period: on in the same direction if
  /// progress improved, the other way if it got worse, with momentum.
  void observe(double t_s, double loss);

private:
  adsp_config cfg_;
  double period_;
  double velocity_;
  bool have_last_ = false;
  double last_t_ = 0, last_loss_ = 0;
  bool have_rate_ = false;
  double last_rate_ = 0;
};

/// ADSP's job planner: every tick, the period from the loss, then each live worker's
/// local steps per commit from its compute per step.
class adsp_job_planner final : public job_planner {
public:
  explicit adsp_job_planner(adsp_config cfg = {}) : planner_(cfg) {}
  bool plans() const override { return true; }
  void on_tick(const planner_view& view, job_plan& out) override;

private:
  adsp_planner planner_;
  std::map<worker_id, uint32_t> sent_;
};

}  // namespace ashlar
