// What the scheduler decides while a job runs, as one interface: on every statistics
// tick a job planner reads what the profiler measured (and, if it asks, the shards'
// staleness counters) and says what changes: each worker's local steps per commit, its
// stage, its batch share and part of the data; the shards' staleness bound, learning-rate
// factor, k and sync/async. The scheduler holds one planner and turns its plans into
// messages; it never branches on a policy's name.
//
// A policy names its planner in the registry (runtime/policy/registry.cpp): adsp,
// adaptive and ashl each have one; the batch allocation (train.allocation) is a planner
// of its own, combined with the policy's. Adding a scheduler-driven policy is one file
// and one registry row. Pure code: no CAF, no clocks, no I/O (log lines come back in the
// plan).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/policy/sync_policy.hpp"

namespace ashlar {

struct train_config;

/// One live worker as the profiler last measured it (smoothed per step).
struct planner_worker {
  worker_id id = 0;
  uint64_t steps = 0;
  /// Wall seconds per step, its compute, and its waits imposed by the policy.
  double step_s = 0;
  double compute_s = 0;
  double wait_s = 0;
  /// Compute seconds per sample.
  double compute_per_sample = 0;
};

/// What a planner sees at a statistics tick.
struct planner_view {
  /// Seconds since training began, and the smoothed training loss.
  double t_s = 0;
  double loss = 0;
  /// Training samples every worker together has trained so far.
  uint64_t samples = 0;
  /// Live workers the profiler has figures for, in its order.
  std::vector<planner_worker> workers;
  /// Live members, whether measured yet or not.
  size_t live_members = 0;
  /// Shard 0's staleness counters (only when the planner wants_staleness()): staleness
  /// summed over its pushes so far, and how many pushes (applied and dropped).
  uint64_t staleness_sum = 0;
  uint64_t pushes = 0;
};

/// Settings of every shard.
struct shard_settings {
  /// Bounded staleness: commits a worker may run ahead of the slowest, and the factor on
  /// the learning rate.
  std::optional<std::pair<uint64_t, float>> bound;
  /// k (gradients per update) and whether late ones are kept (async).
  std::optional<std::pair<uint32_t, bool>> tune;
  bool empty() const { return !bound && !tune; }
};

/// A worker's stage (ASHL): its name, local steps per commit, learning-rate factor and
/// pull compression (0: dense).
struct stage_directive {
  std::string stage;
  uint32_t local_steps = 1;
  float lr_scale = 1.0f;
  float pull_ratio = 0;
};

/// A worker's batch share from step `from_step` on, and its part of the training set;
/// `steps`, when not 0, the steps it trains in all from now on (a lost member's rounds
/// handed over).
struct batch_directive {
  uint32_t share = 0;
  uint64_t from_step = 0;
  uint64_t data_begin = 0;
  uint64_t data_count = 0;
  uint64_t steps = 0;
};

/// A job event for the run's trace and metrics.
struct plan_event {
  std::string name;
  std::string detail;
};

/// What a planner call changed; everything else stays as it was.
struct job_plan {
  shard_settings shards;
  std::map<worker_id, uint32_t> local_steps;
  std::map<worker_id, stage_directive> stages;
  std::map<worker_id, batch_directive> batches;
  std::vector<plan_event> events;
  /// The stage now in force (an ashl_stage), when it changed.
  std::optional<int> stage;
  /// Lines for the scheduler's log, at info and at debug level.
  std::vector<std::string> info;
  std::vector<std::string> debug;
};

/// What the planners need of the job beyond train_config.
struct planner_context {
  const train_config* job = nullptr;
  /// Training samples the workers split between them.
  uint64_t train_size = 0;
  /// Whether the policy's workers advance in rounds together (sync_policy::lockstep).
  bool lockstep = false;
  /// A resumed job's stage when it stopped ("shl": ASHL goes to SHL after profiling
  /// again); "" otherwise.
  std::string resume_stage;
  /// A resumed job's batch share per worker id, as checkpointed.
  std::map<worker_id, uint32_t> resume_batches;
};

class job_planner {
public:
  virtual ~job_planner();

  /// True if the planner decides anything while the job runs (the scheduler then ticks
  /// it every planner_tick_ms).
  virtual bool plans() const = 0;

  /// True if on_tick needs shard 0's staleness counters in its view.
  virtual bool wants_staleness() const { return false; }

  /// Milliseconds between two ticks. Default: planner_tick_ms.
  virtual int tick_ms() const;

  /// Training starts: the shards' first settings.
  virtual void on_start(job_plan& out) { (void) out; }

  /// A statistics tick while the job runs.
  virtual void on_tick(const planner_view& view, job_plan& out) = 0;

  /// Worker `w` joined the running job: what it needs beyond its assignment.
  virtual void on_join(worker_id w, job_plan& out) {
    (void) w;
    (void) out;
  }

  /// A resumed worker starts from its checkpointed batch share and data part.
  virtual void on_resumed(worker_id w, const batch_directive& batch) {
    (void) w;
    (void) batch;
  }

  /// The settings a shard served again (after a loss) must be given.
  virtual shard_settings shard_state() const { return {}; }
};

/// Adds to `out` each worker of `plan` whose local steps differ from `sent` (as last
/// sent), and records them in `sent`.
void plan_local_steps(std::map<worker_id, uint32_t>& sent, const std::map<worker_id, uint32_t>& plan,
                      job_plan& out);

/// Milliseconds between two planner ticks, unless a planner asks for others.
constexpr int planner_tick_ms = 500;

/// The job's planner: its policy's (the registry row's), combined with the batch
/// allocation's when train.allocation is not "equal". Never null: a job with nothing to
/// plan gets one whose plans() is false.
std::unique_ptr<job_planner> make_job_planner(const planner_context& ctx);

/// Several planners as one: each sees every call, in order, and adds to the same plan.
class combined_planner final : public job_planner {
public:
  explicit combined_planner(std::vector<std::unique_ptr<job_planner>> parts);
  bool plans() const override;
  bool wants_staleness() const override;
  /// The shortest of the parts'.
  int tick_ms() const override;
  void on_start(job_plan& out) override;
  void on_tick(const planner_view& view, job_plan& out) override;
  void on_join(worker_id w, job_plan& out) override;
  void on_resumed(worker_id w, const batch_directive& batch) override;
  shard_settings shard_state() const override;

private:
  std::vector<std::unique_ptr<job_planner>> parts_;
};

/// What the scheduler needs to know of a policy beyond its shard side and its planner.
/// How the stated rules (runtime/policy/policy_rules.hpp) derive a policy's settings from
/// the recipe of synchronous training.
enum class rule_family : uint8_t {
  averaged,    ///< every worker's gradient in every round, averaged (bsp, ring): the recipe as it is
  k_of_w,      ///< a round averages k of the W workers' gradients (ksync): linear scaling
  async_push,  ///< every push is a step of one worker's gradient (asp, ssp, kasync, adaptive)
  local_steps, ///< local steps, commits of parameter deltas (adsp, ashl)
};

struct rule_writer; // runtime/policy/policy_rules.hpp

struct policy_traits {
  /// Workers advance in rounds together (sync_policy::lockstep).
  bool lockstep = false;
  /// Pushes are commits of local steps (adsp, ashl): each counts as one worker's share of
  /// a model average unless train.commit_scale says otherwise.
  bool commits = false;
  /// Decentralized (ring): the live workers form a ring in id order, formed again when one
  /// is lost or joins; its pushes mirror the model, never compressed.
  bool ring = false;
  /// Its stated rules' family.
  rule_family rules = rule_family::averaged;
  /// Its own rules after its family's (ashl's shorter local steps...); null: none. With a
  /// script's optimizer (train.optimizer = script), `own_script_rules`.
  void (*own_rules)(rule_writer&) = nullptr;
  void (*own_script_rules)(rule_writer&) = nullptr;
};

/// The traits of the policy `name` (a registry name; unknown names get all false).
policy_traits traits_of(const std::string& name);

/// The fraction of each range a push carries (0: dense): train.topk_ratio when set, else
/// the policy's default (ashl: ashl.topk_ratio); 0 for a ring.
double push_topk_ratio(const train_config& job);

}  // namespace ashlar
