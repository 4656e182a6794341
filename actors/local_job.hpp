// Runs a whole training job inside one actor_system: profiler, server shards, scheduler
// and workers as actors in this process. Blocks the calling thread until the job ends.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "actors/gpu_actor.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/metrics/report.hpp"
#include "runtime/wire/messages.hpp"

namespace caf {
class actor_system;
}

namespace ashlar {
class http_endpoint;
}

namespace ashlar::actors {

class gpu_pool;

/// A live view of a running job, handed to job_hooks::on_progress.
struct progress_event {
  double seconds = 0;            // since the workers started
  double epoch = 0;              // samples processed / training-set size
  uint64_t samples = 0;
  double samples_per_second = 0; // over the last interval
  double loss = 0;               // smoothed training loss
  double lr = 0;                 // the learning rate now (train.lr times the schedule's factor)
  std::vector<std::pair<std::string, double>> metrics; // the last value of each metric the scripts reported
  std::vector<wire::worker_stats> workers;
};

struct job_hooks {
  /// Called every run.progress_interval seconds (if > 0) from the calling thread.
  std::function<void(const progress_event&)> on_progress;
  /// Called after each epoch's test evaluation (if run.eval_every_epoch).
  std::function<void(const epoch_point&)> on_epoch;
  /// Called for each report of named metrics from a worker's script (ashlar.torch.report).
  std::function<void(const metric_point&)> on_metrics;
  /// Where the job publishes its Prometheus metrics (a node's endpoint, which outlives
  /// the job). Null: the job serves its own on run.metrics_listen, if that is set.
  http_endpoint* metrics = nullptr;
  /// The GPUs for the job's workers (a host application that manages its devices, or a
  /// test's emulated ones). Null: the devices run.gpus names.
  std::function<std::shared_ptr<gpu_pool>(caf::actor_system&)> gpus;
  /// The compute backend of every worker and of the test evaluations, from a host
  /// application that brings its own (e.g. its network in LibTorch, for a model with an
  /// `external` layer). Null: GPUs as run.gpus says, the CPU for the rest.
  backend_factory make_backend;
  /// Polled every tick: once true, the job stops as at its time limit (each worker
  /// finishes its step and leaves; the final evaluation, checkpoint and report follow).
  std::function<bool()> stop_requested;
};

/// Loads the data named by `cfg`, trains, evaluates the final parameters on the test set
/// and returns the summary. Errors: invalid_config for a bad configuration, io_error or
/// corrupt_data for the data set, invalid_state if every worker failed.
[[nodiscard]] expected<run_report> run_local_job(const train_config& cfg,
                                                 const job_hooks& hooks = {});

/// Same, and also hands back the final parameters in `final_params` (for comparing runs
/// bit for bit).
[[nodiscard]] expected<run_report> run_local_job(const train_config& cfg, const job_hooks& hooks,
                                                 std::vector<float>* final_params);

}  // namespace ashlar::actors
