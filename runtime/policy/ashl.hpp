// ASHL (Shen et al., IEEE Trans. Computers 73(1), 2024): multi-stage training for
// heterogeneous clusters. A profiling stage measures each worker's step and communication
// time; the coarse AHL stage then trains asynchronously with infrequent commits (local
// steps H_i chosen so that H_i x t_i + comm_i is equal across workers: nobody waits) and a
// large allowed gap; once the model reaches a level (a loss plateau, or a target loss)
// the fine SHL stage commits frequently with a small allowed gap.
//
// Shard side: bounded staleness (SSP) whose bound the scheduler moves with the stage
// (ashl_policy). Planning: ashl_planner, driven by the scheduler with the profiler's
// numbers. Pure code: no CAF, no clocks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config/policy_settings.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/policy/ssp.hpp"

namespace ashlar {

/// Shard side: SSP over commits, with the bound set by the stage in force.
class ashl_policy final : public ssp_policy {
public:
  explicit ashl_policy(policy_config cfg) : ssp_policy(cfg) {}
  const char* name() const override { return "ashl"; }
};

enum class ashl_stage : uint8_t { profiling = 0, ahl = 1, shl = 2 };

/// "profiling", "ahl" or "shl".
const char* to_string(ashl_stage s);

/// What the planner needs of one live worker: seconds per local step (compute), seconds
/// per commit's communication (pull + push), steps done.
struct ashl_worker {
  uint32_t id = 0;
  double step_s = 0;
  double comm_s = 0;
  uint64_t steps = 0;
};

/// One stage change: when (seconds since training began) and to which stage.
struct ashl_event {
  double t_s = 0;
  ashl_stage to = ashl_stage::profiling;
  std::string why;
};

class ashl_planner {
public:
  /// Fails with invalid_config naming the field if the settings are inconsistent.
  /// `epoch_samples`: the training set's size, the unit of plateau_window_epochs.
  [[nodiscard]] static expected<ashl_planner> make(ashl_config cfg, uint64_t epoch_samples = 60000);

  ashl_stage stage() const { return stage_; }

  /// One observation: `t_s` seconds into training, the smoothed training loss, the live
  /// workers, and `samples`, the training samples all workers have trained so far (the
  /// plateau window counts them). Moves profiling -> AHL once every live worker has
  /// profile_steps steps (and a time), and AHL -> SHL on the rule. Returns the change, if
  /// one happened.
  std::optional<ashl_event> observe(double t_s, double loss, const std::vector<ashl_worker>& live,
                                    uint64_t samples = 0);

  /// Local steps per commit of each worker in the current stage: 1 while profiling;
  /// otherwise the slowest worker (largest step_s) takes the stage's H, or more if its
  /// communication would exceed max_comm_share of the period, and the period
  /// P = H x t_slow + comm_slow sets every other worker's H_i = round((P - comm_i) / t_i),
  /// within [1, max_local_steps]. A worker with no time yet gets 1.
  std::map<uint32_t, uint32_t> local_steps(const std::vector<ashl_worker>& live) const;

  /// Commits a worker may run ahead of the slowest in the current stage (profiling:
  /// AHL's, so the fast workers train at their pace, one step per commit, while the
  /// slowest one's steps are timed, instead of waiting for it).
  uint64_t allowed_gap() const;

  /// The learning-rate factor of the stage in force (shl_lr_scale in SHL, else 1).
  float lr_scale() const;

  /// The pull compression decided when profiling ended (see pull_topk_ratio): the
  /// fraction each pull carries, 0 for dense pulls (always 0 while profiling).
  float pull_ratio() const { return pull_ratio_; }

  /// A resumed job: after profiling (the cluster may have changed, so it is profiled
  /// again) go straight to `s` (SHL), not AHL, if the job had got that far.
  void resume_in(ashl_stage s) { resume_stage_ = s; }

  /// Every stage change so far, in order.
  const std::vector<ashl_event>& events() const { return events_; }

private:
  ashl_planner(ashl_config cfg, uint64_t epoch_samples) : cfg_(std::move(cfg)), epoch_samples_(epoch_samples) {}
  ashl_config cfg_;
  uint64_t epoch_samples_;
  ashl_stage stage_ = ashl_stage::profiling;
  ashl_stage resume_stage_ = ashl_stage::ahl;
  float pull_ratio_ = 0;
  std::vector<ashl_event> events_;
  struct loss_seen {
    double t_s;
    uint64_t samples;
    double loss;
  };
  std::vector<loss_seen> losses_; // seen in AHL
};

/// Milliseconds between two ticks of ASHL's planner.
constexpr int ashl_tick_ms = 250;

/// ASHL's job planner: feeds the stage machine the profiler's numbers. A stage change
/// goes to every shard (the allowed gap and learning-rate factor) and every live worker
/// (the stage, its local steps, the pull compression). Between changes each worker's
/// local steps follow its measured step time (H_i x t_i + comm_i equal across workers),
/// a worker that joined late included, once it has times.
class ashl_job_planner final : public job_planner {
public:
  /// Fails with invalid_config naming the field if ctx.job->ashl is inconsistent.
  [[nodiscard]] static expected<std::unique_ptr<ashl_job_planner>> make(const planner_context& ctx);
  bool plans() const override { return true; }
  /// ASHL's stage switch is read from the loss at every tick: ticks every
  /// ashl_tick_ms, so a cluster that reaches a plateau in seconds is not held in
  /// AHL for half a second past it.
  int tick_ms() const override;
  void on_start(job_plan& out) override;
  void on_tick(const planner_view& view, job_plan& out) override;
  void on_join(worker_id w, job_plan& out) override;
  shard_settings shard_state() const override;

  const ashl_planner& planner() const { return planner_; }

private:
  ashl_job_planner(ashl_planner p, double push_ratio, double pull_ratio_set)
    : planner_(std::move(p)), push_ratio_(push_ratio), pull_ratio_set_(pull_ratio_set) {}
  // train.pull_topk_ratio when set, else what the planner decided.
  float pull_ratio() const;
  stage_directive directive(uint32_t local_steps) const;

  ashl_planner planner_;
  double push_ratio_;     // the fraction each push carries (0: dense)
  double pull_ratio_set_; // train.pull_topk_ratio (0: the planner decides)
  std::map<worker_id, uint32_t> sent_; // local steps as last sent
  std::map<worker_id, double> comm_;   // communication per commit, smoothed
};

/// ashl's own rules (runtime/policy/policy_rules.hpp), after the local-step family's:
/// local steps half as long as adsp's with each worker's own momentum, commits twice as
/// heavy, a batch held to about one recipe batch a round, communication held to 0.1 of
/// the commit period. With a script's optimizer: dense commits and pulls.
void ashl_rules(rule_writer& w);
void ashl_script_rules(rule_writer& w);

}  // namespace ashlar
