#include "runtime/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace ashlar {

expected<lr_schedule::kind_t> parse_lr_schedule(const std::string& name) {
  if (name == "constant")
    return lr_schedule::constant;
  if (name == "cosine")
    return lr_schedule::cosine;
  if (name == "step")
    return lr_schedule::step;
  return make_error(errc::invalid_config,
                    "train.lr_schedule: unknown schedule '" + name + "' (choices: constant, cosine, step)");
}

const char* to_string(lr_schedule::kind_t kind) {
  switch (kind) {
    case lr_schedule::cosine:
      return "cosine";
    case lr_schedule::step:
      return "step";
    default:
      return "constant";
  }
}

double lr_factor(const lr_schedule& s, double epoch, double epochs) {
  const double t = epochs > 0 ? std::clamp(epoch / epochs, 0.0, 1.0) : 0.0;
  double f = 1.0;
  switch (s.kind) {
    case lr_schedule::cosine:
      f = 0.5 * (1.0 + std::cos(M_PI * t));
      break;
    case lr_schedule::step:
      f = t >= 0.75 ? 0.01 : t >= 0.5 ? 0.1 : 1.0;
      break;
    case lr_schedule::constant:
      break;
  }
  const double warmup = std::min(s.warmup_epochs, epochs / 2);
  if (warmup > 0 && epoch < warmup)
    f *= std::max(0.01, std::max(epoch, 0.0) / warmup);
  return f;
}

double schedule_epoch(double epoch, double epochs, double seconds, double time_limit) {
  return time_limit > 0 ? std::max(epoch, epochs * seconds / time_limit) : epoch;
}

}  // namespace ashlar
