// The summary of a finished training run, written as JSON by --report.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

struct epoch_point {
  double epoch = 0;
  double seconds = 0;
  double test_accuracy = 0;
  double train_loss = 0;
  uint64_t bytes = 0; // tensor bytes the workers had pulled and pushed by then
};

/// A report of named metrics from a worker's script (ashlar.torch.report), as the job
/// received it.
struct metric_point {
  double seconds = 0;   // into training
  double epoch = 0;     // the job's samples then, over the training set (0 where it has none)
  uint64_t samples = 0; // the job's samples then
  uint32_t worker_id = 0;
  std::vector<std::pair<std::string, double>> values;
};

struct worker_summary {
  uint32_t worker_id = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  double samples_per_second = 0;
  double compute_seconds = 0; // total
  double wait_seconds = 0;    // total
  uint32_t stage_changes = 0; // behaviour changes the worker made (ASHL stages)
};

struct run_report {
  std::string policy;
  std::string optimizer = "sgd";  // train.optimizer: sgd (the shards'), or script (the workers' scripts'; no test
                                  // evaluation of the job's own: test_accuracy and test_loss are null)
  std::string model;
  std::string backend = "cpu";
  uint32_t workers = 0;
  uint32_t servers = 0;
  uint32_t epochs = 0;
  uint32_t batch_size = 0;
  uint64_t seed = 0;
  uint64_t train_samples = 0;
  uint64_t test_samples = 0;
  double test_accuracy = 0;
  double test_loss = 0;
  double seconds = 0;         // of training: from when it started (every worker joined) to its end
  double startup_seconds = 0; // from the job's start until training started (workers joining, data loading)
  double samples_per_second = 0;
  uint64_t samples = 0;
  uint64_t versions = 0;          // summed over shards
  uint64_t dropped = 0;           // gradients dropped by the policy
  double mean_staleness = 0;
  uint64_t bytes = 0;             // tensor bytes the workers pulled and pushed
  uint64_t dense_bytes = 0;       // what those pulls and pushes would have moved uncompressed
  bool stopped_early = false;     // asked to stop (a signal) before its epochs were done
  bool target_reached = false;    // stopped when an evaluation reached run.target_accuracy, or a report run.target
  std::string target;             // run.target ("" none)
  bool time_limited = false;      // stopped at run.time_limit before its epochs were done
  double epochs_trained = 0;      // the job's samples so far over the training set (a resumed job's included): the
                                  // more of `samples` and `applied_samples`
  uint64_t redone_samples = 0;     // a resume: samples the interrupted run trained past its last cut, trained again
  /// The samples whose gradients shard 0 applied in this run (a push cut short: its
  /// share): what was trained, as against `samples`, what the workers reported.
  uint64_t applied_samples = 0;
  uint32_t lost_workers = 0;       // workers lost while the job ran (a process killed, a node gone)
  uint64_t reassigned_samples = 0; // lost or removed workers' untrained samples the others took over, summed over handovers
  std::string error;              // why the run failed ("" if it did not); the other figures are then partial
  /// Checkpoint cuts the job abandoned, each with its cause ("cut 4: shard 1 ..."): a resume
  /// starts from the last committed cut before them.
  std::vector<std::string> abandoned_cuts;
  uint64_t refused_reports = 0;    // step reports the profiler refused (not a member's, impossible, replayed)
  std::vector<epoch_point> history;
  std::vector<metric_point> metrics; // the scripts' reports of named metrics, in order
  std::vector<worker_summary> per_worker;
};

/// Sets `name`'s value in `values` (the last value of each name, in order of first
/// appearance): replaced where it is there, appended where not.
void keep_last(std::vector<std::pair<std::string, double>>& values, const std::string& name, double value);

/// The report as a JSON object.
std::string to_json(const run_report& r);

/// The report of a run that failed before it could finish: its settings and `error`.
run_report failed_report(const std::string& policy, const std::string& model, uint32_t workers, uint32_t servers,
                         uint32_t epochs, const std::string& error);

/// Writes the JSON to `path` (atomically: a temporary file renamed into place).
/// Fails with io_error naming the path.
[[nodiscard]] caf::error write_report(const run_report& r, const std::string& path);

}  // namespace ashlar
