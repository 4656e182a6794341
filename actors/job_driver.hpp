// The job driver: sets up one training job around a placement (where shards and workers
// run: this process or cluster nodes), follows it to the end, evaluates and reports.
#pragma once

#include <memory>
#include <vector>

#include "actors/local_job.hpp"
#include "actors/interfaces.hpp"
#include "runtime/data/dataset.hpp"

namespace ashlar::actors {

/// Decides where a job's shards and workers run.
class job_placement {
public:
  virtual ~job_placement();

  /// Creates one shard per range, holding init[range.begin, range.end), each keeping a
  /// running average of its parameters with this half-life in samples where
  /// `average_samples` > 0 (train.average_epochs). Blocks until every shard exists or one
  /// fails.
  [[nodiscard]] virtual expected<std::vector<shard_actor>>
  make_shards(const std::vector<shard_range>& ranges, const std::vector<float>& init, const train_config& cfg,
              double average_samples) = 0;

  /// Starts cfg.workers workers; they register with `scheduler` themselves. `train` is
  /// the training set as the driver loaded it (local workers share it).
  [[nodiscard]] virtual caf::error start_workers(const train_config& cfg,
                                                 const scheduler_actor& scheduler,
                                                 const profiler_actor& profiler,
                                                 std::shared_ptr<const dataset> train) = 0;

  /// After make_shards: where workers reach each shard's data plane, and the key to
  /// present. Default: none (every pull and push goes over CAF).
  virtual std::vector<std::string> data_endpoints() const { return {}; }
  virtual std::string data_key() const { return {}; }

  /// Whether workers can join the job while it runs (a cluster's nodes): then a job whose
  /// workers were all lost waits for newcomers (run.shard_wait) instead of ending.
  virtual bool takes_joiners() const { return false; }

  /// The job ended (done or failed): stop what start_workers started.
  virtual void on_job_end() {}

  /// The job driver, which takes (shard_atom, index, shard, data endpoint) when a lost
  /// shard is served again, and (shard_atom, index, why) when a try to serve it again
  /// starts or fails (the error the job ends with, if it never is, says why). Set before
  /// make_shards.
  void set_driver(caf::actor driver) { driver_ = std::move(driver); }

protected:
  caf::actor driver_;
};

/// The training and test sets a configuration names.
struct job_data {
  dataset train;
  dataset test;
};

/// Loads data.source from data.dir (or makes the synthetic set from `seed`), applying the
/// limits, and checks the samples against the model's input and classes.
[[nodiscard]] expected<job_data> load_job_data(const data_settings& data, const model_spec& model, uint64_t seed);

/// Runs one job in `sys` with shards and workers where `where` puts them; blocks the
/// calling thread (which must not be a CAF scheduler thread) until it ends. Fails with
/// peer_unreachable if a shard is lost, invalid_state if every worker failed.
[[nodiscard]] expected<run_report> run_job(caf::actor_system& sys, const train_config& cfg,
                                           job_placement& where, const job_hooks& hooks,
                                           std::vector<float>* final_params = nullptr);

}  // namespace ashlar::actors
