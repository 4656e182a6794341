// When the job driver acts while a job trains: progress lines, evaluations (an epoch
// boundary crossed, or the evaluation interval passed), the progress note a resume counts
// from, the metrics refresh, a lost shard's deadline, the time limit, and for workers at
// their own pace the stop at the job's sample budget. The driver used to poll for all of
// these every 10-100 ms; it now waits for its messages until the next of them is due, and
// asks this machine which are due when it wakes. Epoch boundaries and the budget are not
// clock times: they are predicted from the rate the job trains at, and looked at again as
// they come near, so a boundary is seen within a small fraction of a step of it.
//
// Pure, on a clock_source: the driver (actors/job_driver.cpp) feeds it what it learns (the
// samples trained, a shard lost or served again, an evaluation started) and carries out
// the duties it returns.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/core/clock.hpp"

namespace ashlar::control {

struct timeline_settings {
  double progress_interval = 0; ///< s between progress lines; 0: none
  double eval_interval = 0;     ///< s between mid-run evaluations; 0: none on a timer
  bool eval_every_epoch = false;///< an evaluation at each epoch boundary (before the last)
  uint32_t epochs = 1;
  uint64_t epoch_samples = 0;   ///< the training set's size
  uint64_t done_before = 0;     ///< samples a resumed job trained before
  uint64_t budget = 0;          ///< samples of the whole job (epochs x the set)
  bool stop_at_budget = false;  ///< workers at their own pace: the driver stops them
  double time_limit = 0;        ///< s; 0: none
  double shard_wait = 0;        ///< s a lost shard may take to be served again
  double note_every = 1.0;      ///< s between progress notes (a resume's count)
  double metrics_every = 0;     ///< s between metrics refreshes; 0: no endpoint
  /// The longest wait between two looks at the job's figures: the divergence guard and the
  /// learning-rate schedule follow the loss and the epochs at this resolution.
  double max_wait = 0.1;
  /// The shortest wait: a boundary predicted to be nearer is looked at this soon.
  double min_wait = 0.005;
  /// s a job asked to stop (ctl stop-job, a shutdown, Ctrl-C) gives its workers to finish
  /// their step and leave: past it, the job ends without those still stepping (a hung
  /// worker, one whose node is gone, a wait for a lost shard), so that a stop ends any job
  /// within seconds in every state.
  double stop_grace = 3.0;
};

/// What is due at one look.
struct timeline_duties {
  bool progress = false;     ///< a progress line
  bool evaluate = false;     ///< a mid-run evaluation (unless one still runs)
  bool interval_eval = false;///< ... of which the interval's (it keeps to its grid)
  bool note = false;         ///< the progress note for a resume
  bool metrics = false;      ///< refresh the shards' counters for the metrics endpoint
  bool stop_budget = false;  ///< the sample budget is reached: stop the workers
  bool stop_time = false;    ///< the time limit is reached: stop the workers
  bool stop_overdue = false; ///< a stop was asked stop_grace ago: the job ends now
  std::vector<size_t> shards_expired; ///< lost shards whose wait is over: the job fails
};

class job_timeline {
public:
  job_timeline(const clock_source& clock, timeline_settings s);

  /// Training starts (the job's clock restarts here: the workers' joining is not training).
  /// Shards lost before keep their deadlines, counted from their loss.
  void training_started();
  /// Seconds since training started (or since the timeline was made, before).
  double seconds() const;

  /// One look at the job's figures: `samples` trained in this run so far. Returns what is
  /// due now.
  timeline_duties look(uint64_t samples);
  /// An evaluation started at this look (`interval`: the timer's, which keeps to its grid
  /// of eval_interval unless it fell behind by more than one).
  void evaluation_started(bool interval, uint64_t samples);

  /// How long the driver may wait for messages before its next look, in seconds.
  double wait() const;

  /// The job was asked to stop now (a second request keeps the first's time).
  void stop_asked();
  bool stop_was_asked() const { return stop_asked_ns_ > 0; }
  /// Whether a stop was asked stop_grace or longer ago.
  bool stop_overdue() const;

  /// Shard `index` was lost now (a second loss before it is served again keeps the first).
  void shard_lost(size_t index);
  void shard_back(size_t index) { lost_ns_.erase(index); }
  bool shards_lost() const { return !lost_ns_.empty(); }
  bool shard_lost_now(size_t index) const { return lost_ns_.count(index) > 0; }
  /// Lost shards whose wait is over (the job fails naming them).
  std::vector<size_t> expired_shards() const;

  /// The next epoch boundary an evaluation waits for (1-based), and the last seen rate.
  uint32_t next_epoch() const { return next_epoch_; }
  double samples_per_second() const { return rate_; }
  const timeline_settings& settings() const { return s_; }

private:
  /// The sample count of the next boundary the timeline watches (an epoch evaluation or the
  /// budget), or 0 when none.
  uint64_t next_boundary() const;

  const clock_source& clock_;
  timeline_settings s_;
  uint64_t start_ns_ = 0;
  bool training_ = false;
  uint32_t next_epoch_ = 1;
  double last_progress_ = 0, last_eval_ = 0, last_note_ = 0, last_metrics_ = -1;
  bool stop_due_sent_ = false;
  // The rate, from the last two looks.
  double last_look_ = -1, rate_ = 0;
  uint64_t last_samples_ = 0;
  std::map<size_t, uint64_t> lost_ns_; // lost shards: when (steady ns)
  uint64_t stop_asked_ns_ = 0;          // when the stop was asked (steady ns; 0: not asked)
};

}  // namespace ashlar::control
