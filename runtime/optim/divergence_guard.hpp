// The divergence guard: watches the job's smoothed training loss and, when the run
// diverges, has the job back off instead of training on at chance accuracy.
//
// Diverged: the loss is not finite, or it stays (two readings running) above 1.5x its
// starting level and a nat more, or, once training had made real progress (the best loss
// below 0.6x the start and at least half a nat under it), above the best plus 3/4 of the
// progress made, or it has not fallen below 0.9x its start within `patience_samples`
// (a network that died at a loss near chance). Backing off puts the last good
// snapshot of the parameters back on the shards (their momentum starts over) and halves
// the learning rate; the guard then waits `settle_s` for the loss to reflect it. A
// snapshot is taken every `snapshot_every_s` while the loss is near its best. After
// `max_backoffs` back-offs it gives up: the job stops with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ashlar {

struct divergence_settings {
  double snapshot_every_s = 2.0;
  double settle_s = 1.0;
  uint32_t max_backoffs = 6;
  /// Samples trained without the loss falling below 0.9x its start before that counts as
  /// divergence (0: never), for a run that starts near start_hint (not a resumed one
  /// that starts low). The job driver uses an epoch past the warmup.
  uint64_t patience_samples = 0;
  /// The loss of an untrained model (a classifier over C classes: ln C): the no-progress
  /// rule measures against the lower of it and the first reading (which may already be
  /// diverging). 0: no such rule.
  double start_hint = 0;
};

class divergence_guard {
public:
  enum class action { none, snapshot, back_off, give_up };

  explicit divergence_guard(divergence_settings s = {});

  /// The job's smoothed training loss at `now` (seconds; may be NaN or infinite), after
  /// `samples` trained.
  action observe(double loss, double now, uint64_t samples = 0);
  /// A snapshot of the parameters was taken at `now`, with the loss then.
  void snapshot_taken(double loss, double now);
  /// The snapshot was put back and the lr halved at `now`.
  void backed_off(double now);

  /// The learning-rate factor the back-offs leave: 0.5 ^ backoffs.
  double lr_scale() const { return lr_scale_; }
  uint32_t backoffs() const { return backoffs_; }
  /// Why the last back_off or give_up was asked for.
  const std::string& why() const { return why_; }

private:
  divergence_settings s_;
  bool started_ = false;
  double start_ = 0, best_ = 0;
  double last_snapshot_ = -1e300, snapshot_loss_ = 0;
  double settle_until_ = -1e300;
  int strikes_ = 0;
  uint64_t samples_ = 0, since_ = 0; // samples seen; where the current attempt began
  uint32_t backoffs_ = 0;
  double lr_scale_ = 1.0;
  std::string why_;
};

/// The workers' reported losses, read against each other. A loss that is not finite from
/// some workers while others report a finite one is a fault of those workers, not the
/// job's divergence, once the shards' parameters are seen to be finite (a model that
/// diverged holds values that are not finite within a step or two of its loss): the job
/// removes them and follows the others' loss. With every worker's loss not finite it is
/// the job's divergence (the guard's to handle).
struct loss_reading {
  std::vector<uint32_t> not_finite; ///< the workers whose loss is not finite
  double others = 0;                ///< the mean of the finite losses (0: none)
  size_t finite = 0;                ///< how many were finite
  /// Whether the workers in not_finite are suspects: some are, and some others are finite.
  bool suspects() const { return !not_finite.empty() && finite > 0; }
};
/// `losses`: (worker, smoothed loss) of the live workers.
loss_reading read_losses(const std::vector<std::pair<uint32_t, double>>& losses);

}  // namespace ashlar
