// The job's own checkpoint store (DIR/job): what a resume starts from, and the rules for
// whether it may (the configuration must match the checkpointed job's, setting by
// setting; the cut taken must be intact on every shard). A record of the job's progress
// goes in with each checkpoint cut the shards have written.
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

class pinned_dir;

struct train_config;

/// Settings a resumed job must share with the checkpointed one, as "key=value": all but
/// where things go (run.*, data.dir), how long (train.epochs) and the pacing emulation
/// (train.speeds, train.sample_ms, train.contention).
std::vector<std::string> job_settings(const train_config& cfg);

/// How `now` (this run's settings) differs from `then` (the checkpointed job's), as
/// "key = value (checkpointed job: value)" joined by "; "; empty when they match. A key
/// missing from `then` was added after the checkpoint: the job ran at its default.
std::string settings_diff(const std::vector<std::string>& then, const std::vector<std::string>& now);

/// One shard's checkpoint cuts that check out, as it reported them.
struct shard_cuts {
  uint32_t shard_id = 0;
  std::vector<uint64_t> intact;
};

/// The cut a job starts from, and why newer committed ones were passed over.
struct cut_choice {
  uint64_t cut = 0;        // 0: from the beginning
  std::string passed_over; // e.g. "cut 9: shard 1 lacks it (holds cuts 7, 8)", or ""
};

/// Which cut a job starts from: the newest of `committed` (the cuts the job record names)
/// that every shard holds intact; 0 when nothing is committed and no shard holds a cut,
/// or when the newest such is the job's start record (cut 0, always held: the shards'
/// cuts are then uncommitted rounds of the same job, dropped).
/// Fails with corrupt_data, in one line naming the shard and what it lacks, when no
/// committed cut is intact everywhere, or when shards hold cuts the job record does not
/// name (its record was lost: starting over would mix two jobs). `where` names the
/// checkpoint directory.
[[nodiscard]] expected<cut_choice> choose_cut(const std::vector<uint64_t>& committed,
                                              const std::vector<shard_cuts>& shards, const std::string& where);

class job_store {
public:
  /// Opens DIR/job (cfg.checkpoint_dir; nothing when it is empty). With cfg.resume: reads
  /// the committed cuts and refuses a configuration that differs, naming each setting;
  /// without: refuses a directory that holds another job.
  [[nodiscard]] static expected<std::optional<job_store>> open(const train_config& cfg);

  /// The cuts a resume may start from (those the job record names), newest first.
  std::vector<uint64_t> committed_cuts() const;
  /// Starts from committed cut `cut` (0: from the beginning): its record becomes this
  /// run's starting point, and records of later cuts are deleted (the next cut is
  /// cut + 1, written anew). From the beginning, the job's start record (cut 0, its
  /// settings) is written, so that a run stopped before its first commit resumes.
  [[nodiscard]] caf::error adopt(uint64_t cut);
  /// The cut adopted.
  uint64_t cut() const { return record_.cut; }
  /// Samples the interrupted run had trained past the adopted cut (as it last noted
  /// them): what this run trains again.
  uint64_t redone_samples() const { return reached_ > samples_before_ ? reached_ - samples_before_ : 0; }

  /// Notes how far this run got (samples in all), about once a second: not a resume
  /// point, only what a resume will count as redone.
  void note_progress(uint64_t samples);

  /// The record as of the start (and the last commit).
  const job_record& record() const { return record_; }
  /// Samples and seconds trained before this run.
  uint64_t samples_before() const { return samples_before_; }
  double seconds_before() const { return seconds_before_; }

  /// Commits cut `cut`, which every shard has on disk, with this run's progress on top of
  /// the earlier runs': `samples` and `seconds` as of the cut, each reporting member's
  /// batch share and data position (members that have not reported in this run keep
  /// their checkpointed entries), and the stage in force ("" leaves it). Errors are
  /// io_error from the store.
  [[nodiscard]] caf::error commit(uint64_t cut, uint64_t samples, double seconds,
                                  const std::vector<wire::worker_stats>& workers, const std::string& stage);

private:
  std::shared_ptr<pinned_dir> pin_; // the directory beneath the work directory (a submitted job)
  std::unique_ptr<kv_store> store_;
  uint32_t keep_ = 3;
  std::vector<job_record> candidates_; // committed cuts, newest first (a resume)
  uint64_t reached_ = 0;               // samples the interrupted run noted
  job_record record_;
  uint64_t samples_before_ = 0;
  double seconds_before_ = 0;
  std::map<uint32_t, uint64_t> worker_samples_before_;
};

}  // namespace ashlar
