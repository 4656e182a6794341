// The job's own checkpoint store (DIR/job): what a resume starts from, and the rules for
// whether it may (the configuration must match the checkpointed job's, setting by
// setting). Progress goes in as the job runs.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/store/checkpoint.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

struct train_config;

/// Settings a resumed job must share with the checkpointed one, as "key=value": all but
/// where things go (run.*, data.dir), how long (train.epochs) and the pacing emulation
/// (train.speeds, train.sample_ms, train.contention).
std::vector<std::string> job_settings(const train_config& cfg);

/// How `now` (this run's settings) differs from `then` (the checkpointed job's), as
/// "key = value (checkpointed job: value)" joined by "; "; empty when they match. A key
/// missing from `then` was added after the checkpoint: the job ran at its default.
std::string settings_diff(const std::vector<std::string>& then, const std::vector<std::string>& now);

class job_store {
public:
  /// Opens DIR/job (cfg.checkpoint_dir; nothing when it is empty). With cfg.resume: reads
  /// the record and refuses a configuration that differs, naming each setting; without:
  /// refuses a directory that holds another job.
  [[nodiscard]] static expected<std::optional<job_store>> open(const train_config& cfg);

  /// The record as of the start (and the last save).
  const job_record& record() const { return record_; }
  /// Samples and seconds trained before this run.
  uint64_t samples_before() const { return samples_before_; }
  double seconds_before() const { return seconds_before_; }

  /// Saves this run's progress on top of the earlier runs': `samples` and `seconds` so
  /// far, each reporting member's batch share and data position (members that have not
  /// reported in this run keep their checkpointed entries), and the stage in force (""
  /// leaves it). Errors are io_error from the store.
  [[nodiscard]] caf::error save(uint64_t samples, double seconds, const std::vector<wire::worker_stats>& workers,
                                const std::string& stage);

private:
  std::unique_ptr<kv_store> store_;
  job_record record_;
  uint64_t samples_before_ = 0;
  double seconds_before_ = 0;
  std::map<uint32_t, uint64_t> worker_samples_before_;
};

}  // namespace ashlar
