// Learning-rate schedules: the factor the configured learning rate is multiplied by at a
// point of training, as a function of the epochs done. Pure; the job driver evaluates it
// as training goes and hands the factor to the shards and workers.
#pragma once

#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

struct lr_schedule {
  enum kind_t { constant, cosine, step } kind = constant;
  /// Epochs of linear warmup up to lr (at most half the epochs); 0 = none.
  double warmup_epochs = 0;
};

/// The schedule named by train.lr_schedule: "constant", "cosine" (half a cosine from 1
/// down to 0 over the epochs) or "step" (x0.1 at half the epochs, x0.01 at three
/// quarters). Fails with invalid_config naming the key and the choices.
[[nodiscard]] expected<lr_schedule::kind_t> parse_lr_schedule(const std::string& name);
const char* to_string(lr_schedule::kind_t kind);

/// The factor at `epoch` (fractional) of `epochs`: the schedule's decay, times the
/// warmup's ramp (epoch / w, floored at 1/100) while epoch < w, where w is warmup_epochs
/// or half the epochs if that is less (a short run of a config with warmup still peaks).
/// Past the last epoch the decay stays where it ended.
double lr_factor(const lr_schedule& s, double epoch, double epochs);

/// Where a run stands on its schedule: `epoch` (trained so far), or with a time limit
/// (> 0) whichever is further, the epochs or the time (`seconds` of `time_limit` spent
/// counts as that fraction of `epochs`), so a run that a time limit ends still decays.
double schedule_epoch(double epoch, double epochs, double seconds, double time_limit);

}  // namespace ashlar
