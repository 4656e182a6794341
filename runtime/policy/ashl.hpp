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

/// ashl.rule: AHL -> SHL on a loss plateau, or at a target loss.
enum class ashl_rule : uint8_t { plateau, loss };

/// "plateau" or "loss"; fails with invalid_config naming ashl.rule.
[[nodiscard]] expected<ashl_rule> parse_ashl_rule(const std::string& name);
const char* to_string(ashl_rule r);

/// "profiling", "ahl" or "shl".
const char* to_string(ashl_stage s);

/// ASHL's settings (config section [ashl], keys ashl.*). Each says its default.
struct ashl_config {
  /// Profiling: steps every live worker completes before the first plan. Default: 5.
  uint32_t profile_steps = 5;
  /// AHL: local steps of the slowest worker per commit; faster ones take more, so every
  /// worker's H_i x t_i + comm_i matches the slowest's. Default: 2.
  uint32_t ahl_local_steps = 2;
  /// AHL: commits a worker may run ahead of the slowest. Default: 16.
  uint64_t ahl_gap = 16;
  /// SHL: local steps of the slowest worker per commit. Default: 1.
  uint32_t shl_local_steps = 1;
  /// SHL: commits a worker may run ahead of the slowest. Default: 2.
  uint64_t shl_gap = 2;
  /// SHL: the learning rate (the shards' and the workers' local one) times this: the fine
  /// stage takes smaller steps. Default: 0.5.
  double shl_lr_scale = 0.5;
  /// Rule for AHL -> SHL: "plateau" (the training loss fell by less than plateau_drop,
  /// relatively, over the last plateau_window_epochs of training samples) or "loss" (the
  /// training loss is at most switch_loss). Default: "plateau".
  ashl_rule rule = ashl_rule::plateau;
  /// The plateau rule's window in epochs of training samples (all workers' together), as
  /// a learning-rate scheduler's patience counts epochs: the loss falls with the samples
  /// trained, so a cluster twice as fast reaches the same plateau in half the seconds and
  /// is judged over half the seconds. (A window of fixed seconds judges a fast cluster's
  /// loss over several times the samples: at speeds 6,7,8,5,1,2,8 a 1.5 s window held
  /// AHL until 2.0 s to 85%, against 1.5 s with a window in samples. Over three profiles,
  /// 3 seeds each, windows of 0.1, 0.2, 0.35 and 0.5 epochs summed 8.8, 8.1, 9.1 and
  /// 11.1 s to 85%; switching at once, 11.8 s.) Default: 0.25 (15K samples of
  /// Fashion-MNIST).
  double plateau_window_epochs = 0.25;
  /// The plateau window in seconds instead, when above 0. Default: 0.
  double plateau_window_s = 0;
  /// Default: 0.1 (10%).
  double plateau_drop = 0.1;
  /// Default: 0.45.
  double switch_loss = 0.45;
  /// Communication may take at most this share of the slowest worker's commit period:
  /// where a commit costs more than that allows (a slow network), the slowest worker
  /// takes more local steps than its stage's H, and the others follow. 1 = no limit.
  /// Default: 0.25.
  double max_comm_share = 0.25;
  /// Most local steps per commit. Default: 64.
  uint32_t max_local_steps = 64;
  /// Pushes in both stages carry this fraction of the gradient (top-k with error
  /// feedback); 0 = dense. train.topk_ratio, when set, wins. Default: 0.1.
  double topk_ratio = 0.1;
  /// Pull compression: after profiling, if communication takes at least
  /// pull_compress_above of the slowest worker's compute per step (measured while every
  /// step commits), pulls in AHL and SHL are delta reads of this fraction of each range
  /// (the entries that changed most, the rest sent later: error feedback); otherwise
  /// they stay dense. 0 = always dense. train.pull_topk_ratio, when set, wins. Default: 0.1.
  double pull_topk_ratio = 0.1;
  /// Default: 0 (pulls are compressed in both stages whatever the network, as pushes
  /// are: a dense pull carries 5 times a compressed push, so without it ASHL's frequent
  /// commits move more bytes than ADSP's rare dense ones. On a fast local network dense
  /// pulls reach a target about 10% sooner: 0.25 keeps them dense unless communication
  /// is a quarter of the slowest step's compute).
  double pull_compress_above = 0;
};

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

}  // namespace ashlar
