// What the profiler knows of the workers: per worker, smoothed step, compute and wait
// times, throughput, compute per sample, staleness, and the compute speed per window
// with a GRU's prediction of the next window's; for the job, samples so far, the smoothed
// training loss, and the time since the first report. The profiler actor feeds it the
// workers' step reports and answers with stats(). Pure code: time from a clock_source.
//
// A report is taken only from a member (a worker the scheduler announced with a join, and
// not gone since), only if it is within what a step can hold (at most the training set's
// samples: no batch is larger) and newer than that worker's last: a member that sends
// reports for ids it does not hold, or figures no step can have, grows nothing here. Each
// refusal is counted and its reason kept for the log.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/clock.hpp"
#include "runtime/predict/speed_predictor.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

class cluster_profile {
public:
  /// `alpha`: weight of the newest step in the smoothing (the job's loss takes alpha/2).
  /// `window`: seconds per speed window (each window's observed speed scores the GRU's
  /// prediction, then trains it). `clock` must outlive the profile.
  explicit cluster_profile(double alpha = 0.1, double window = 0.25, const clock_source& clock = system_clock());

  /// The most samples one step's report may carry (the training set's size: no batch is
  /// larger); 0: no bound. Default: 0.
  void bound_step_samples(uint64_t most) { step_samples_max_ = most; }

  /// One step of one worker. Its timings enter the smoothing from the worker's second
  /// step (a first step carries one-time costs: lazily loaded kernels, cold caches).
  /// Refused (nothing kept, the refusal counted): a report of a worker that is not a
  /// member, with more samples than a step holds, or not newer than its last; the reason
  /// is returned.
  std::optional<std::string> observe(const wire::profile_report& r);

  /// A worker joined (done = false) or left (done = true). Only a joined worker's reports
  /// are taken; one that left stays in the stats.
  void membership(uint32_t worker, bool done);

  /// Reports refused so far.
  uint64_t refused() const { return refused_; }
  /// A report the adapter refused (it came from another sender than the worker's).
  void count_refused() { ++refused_; }

  /// Every worker seen so far, the job's samples and loss, seconds since the first
  /// report (0 before it) and the latest reports of named metrics.
  wire::cluster_stats stats() const;

  /// Reports of named metrics kept for readers (the job driver takes them each look, a
  /// tenth of a second apart; a script reports after its evaluations).
  static constexpr size_t kept_reports = 64;

private:
  struct track {
    wire::worker_stats stats;
    bool seen = false;
    uint64_t window_start = 0;
    double window_samples = 0, window_compute = 0;
    gru_predictor predictor;
    uint64_t predicted_windows = 0;
    double error_sum = 0;
    bool member = false; // joined and not left: its reports are taken
    bool stepped = false; // a report since it joined: the next must be of a later step
    uint64_t last_step = 0;
  };
  std::optional<std::string> refusal(const wire::profile_report& r) const;
  void close_window(track& t, uint64_t now);

  double alpha_;
  double window_;
  const clock_source& clock_;
  std::map<uint32_t, track> workers_;
  bool started_ = false;
  uint64_t start_ = 0;
  uint64_t total_samples_ = 0;
  double loss_ = 0;
  bool loss_seen_ = false;
  std::vector<wire::metric_report> reports_; // the latest, oldest first
  uint64_t reports_seen_ = 0;
  uint64_t step_samples_max_ = 0;
  uint64_t refused_ = 0;
};

}  // namespace ashlar
