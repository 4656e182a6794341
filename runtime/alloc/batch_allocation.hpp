// How a global batch is split among workers of different speeds: equally, in proportion
// to profiled speed (static), or from observed iteration times (self-adaptive). Shares
// always sum to the global batch and each worker gets at least one sample; gradients are
// then weighted by batch size so the global step stays the mean over all samples.
// Pure code.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/alloc/allocation_mode.hpp"
#include "runtime/core/error.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/predict/speed_predictor.hpp"

namespace ashlar {

/// `global` split as evenly as possible over `workers` (the first ones get one more).
[[nodiscard]] expected<std::vector<uint32_t>> equal_shares(uint32_t global, size_t workers);

/// `global` split in proportion to `speeds` (samples per second, > 0), by largest
/// remainder, every worker at least 1. Fails with invalid_argument for an empty list, a
/// speed <= 0 or not finite, or fewer samples than workers.
[[nodiscard]] expected<std::vector<uint32_t>> proportional_shares(uint32_t global,
                                                                  const std::vector<double>& speeds);

/// Self-adaptive allocation: after each round, each worker's speed is estimated as the
/// batch it processed over the time it took (compute only, no waits), smoothed, and the
/// next shares are proportional to it. Equal until every worker has been observed.
class adaptive_allocator {
public:
  /// alpha: weight of the newest observation in the smoothing, in (0, 1]. Default: 0.5.
  adaptive_allocator(uint32_t global, size_t workers, double alpha = 0.5);

  /// Worker i processed `batch` samples in `seconds`.
  void observe(size_t worker, uint32_t batch, double seconds);

  /// Shares for the next round.
  std::vector<uint32_t> shares() const;

private:
  uint32_t global_;
  double alpha_;
  std::vector<double> speed_; // smoothed samples/s; 0 = not observed yet
};

/// The batch allocation as a job planner: shares of the global batch (batch_size x live
/// workers) proportional to each live worker's speed (1 / compute seconds per sample):
/// profiled once ("proportional", then fixed), smoothed observations ("adaptive"), or a
/// GRU's prediction of the next value ("predicted"). The data follows the batch: each
/// worker's part of the training set is in proportion to its share, so a pass over the
/// set is one pass for the job, each sample once per epoch, as with equal batches.
/// Lockstep workers switch together, a few rounds ahead; the others at their next step.
class batch_planner final : public job_planner {
public:
  batch_planner(allocation_mode mode, const planner_context& ctx);
  bool plans() const override { return true; }
  void on_start(job_plan& out) override;
  void on_tick(const planner_view& view, job_plan& out) override;
  void on_resumed(worker_id w, const batch_directive& batch) override;

  /// True once "proportional" has fixed the shares.
  bool frozen() const { return frozen_; }

private:
  allocation_mode mode_;
  uint32_t batch_size_;
  uint64_t train_size_;
  bool lockstep_;
  bool frozen_ = false;
  std::string restored_; // shares restored from a checkpoint, for the log
  std::map<worker_id, batch_directive> sent_;
  std::map<worker_id, gru_predictor> predictors_;
};

}  // namespace ashlar
