#include "actors/local_job.hpp"

#include "actors/job_driver.hpp"
#include "actors/server_shard.hpp"
#include "actors/worker.hpp"

#include <spdlog/spdlog.h>

#include "runtime/policy/policy_rules.hpp"
#include "runtime/os/memory.hpp"
#include "runtime/policy/ring.hpp"

namespace ashlar::actors {

namespace {

class system_config : public caf::actor_system_config {
public:
  system_config() {
    register_types(*this);
    set_fair_scheduling(*this);
  }
};

// Every actor in this process.
class local_placement final : public job_placement {
public:
  local_placement(caf::actor_system& sys, const job_hooks& hooks) : sys_(sys), hooks_(hooks) {}

  expected<std::vector<shard_actor>> make_shards(const std::vector<shard_range>& ranges,
                                                 const std::vector<float>& init, const train_config& cfg,
                                                 double average_samples) override {
    std::vector<shard_actor> out;
    for (const auto& r : ranges) {
      auto policy = make_policy(cfg.policy, cfg.policy_settings);
      if (!policy)
        return policy.error();
      std::vector<float> slice(init.begin() + r.begin, init.begin() + r.end);
      auto core = std::make_unique<shard_core>(r, std::move(slice), shard_optimizer(cfg.policy, job_optimizer(cfg)),
                                               std::move(*policy));
      core->keep_average(average_samples);
      shard_persistence persistence;
      if (!cfg.checkpoint_dir.empty()) {
        // A resume's shards are restored by the job driver, from the cut they all hold.
        auto p = open_shard_persistence(cfg.checkpoint_dir, cfg.checkpoint_keep, false, *core);
        if (!p) {
          for (auto& s : out)
            caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
          return p.error();
        }
        persistence = std::move(*p);
      }
      out.push_back(spawn_shard(sys_, std::move(core), std::move(persistence)));
    }
    return out;
  }

  caf::error start_workers(const train_config& cfg, const scheduler_actor& scheduler,
                           const profiler_actor& profiler,
                           std::shared_ptr<const dataset> train) override {
    // One worker per GPU of this process, the others on the CPU.
    if (hooks_.gpus) {
      gpus_ = hooks_.gpus(sys_);
    } else {
      auto pool = gpu_pool::start(sys_, cfg.gpus, cfg.tf32, cfg.gpu_local_model);
      if (!pool)
        return pool.error();
      gpus_ = std::move(*pool);
      if (gpus_->labels().empty() && cfg.gpus == "auto")
        spdlog::info("job: {}; computing on the CPU", gpus_->why_none());
    }
    worker_config base;
    base.scheduler = scheduler;
    base.profiler = profiler;
    base.data = std::move(train);
    workers_ = start_local_workers(sys_, cfg.workers, base, [this] {
      return hooks_.make_backend ? hooks_.make_backend : gpus_->next_worker();
    });
    return caf::none;
  }

  void on_job_end() override {
    for (auto& w : workers_)
      caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
    if (gpus_) // the job's GPU actors end with it, whoever else holds the pool
      gpus_->stop();
  }

private:
  caf::actor_system& sys_;
  const job_hooks& hooks_;
  std::vector<worker_actor> workers_;
  std::shared_ptr<gpu_pool> gpus_;
};

}  // namespace

expected<run_report> run_local_job(const train_config& cfg, const job_hooks& hooks) {
  return run_local_job(cfg, hooks, nullptr);
}

expected<run_report> run_local_job(const train_config& cfg, const job_hooks& hooks,
                                   std::vector<float>* final_params) {
  // Everything lives in this process: the shards' parameters and optimizer state (2
  // copies), and each worker's parameters, gradients, commit and pull view (4 each).
  if (!validate_job(cfg)) {
    const uint64_t copies = 2 + 4 * uint64_t{cfg.workers};
    if (auto err = check_model_memory(cfg.model.num_params(), copies, available_memory_bytes(), cfg.model.to_string()))
      return err;
  }
  system_config sys_cfg;
  caf::actor_system sys{sys_cfg};
  local_placement where{sys, hooks};
  return run_job(sys, cfg, where, hooks, final_params);
}

}  // namespace ashlar::actors
