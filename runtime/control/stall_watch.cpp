#include "runtime/control/stall_watch.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/core/number_text.hpp"

namespace ashlar::control {

double stall_deadline(double slowest_step_s, const stall_rule& rule) {
  const double step = std::isfinite(slowest_step_s) && slowest_step_s > 0 ? slowest_step_s : 0;
  return std::clamp(rule.factor * step, rule.floor_s, rule.ceiling_s);
}

stall_verdict judge_stall(const stall_view& view, const stall_rule& rule) {
  stall_verdict v;
  double slowest = 0;
  for (double s : view.step_seconds)
    slowest = std::max(slowest, std::isfinite(s) ? s : 0.0);
  v.deadline_s = stall_deadline(slowest, rule);
  if (view.holding_up.empty() || view.held_seconds < v.deadline_s)
    return v;
  v.remove = view.holding_up;
  v.why = "the others waited " + number_text("%.0f", view.held_seconds) + " s for its step, past the deadline of "
          + number_text("%.0f", v.deadline_s) + " s (" + number_text("%g", rule.factor)
          + "x the slowest step measured, " + number_text("%.3g", slowest) + " s, within "
          + number_text("%g", rule.floor_s) + "-" + number_text("%g", rule.ceiling_s) + " s)";
  return v;
}

}  // namespace ashlar::control
