// The batch allocation (runtime/alloc) as a job planner: the scheduler's rounds of new
// shares for the live workers, from their measured or predicted speeds. Pure code.
#pragma once

#include <map>
#include <string>

#include "runtime/alloc/batch_allocation.hpp"
#include "runtime/config/allocation_mode.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/predict/speed_predictor.hpp"

namespace ashlar {

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
