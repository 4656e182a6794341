#include "runtime/policy/adsp.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/fmt/fmt.h>

namespace ashlar {

push_decision adsp_policy::on_push(worker_id, uint64_t base_version, uint64_t version) {
  push_decision d;
  d.kind = push_decision::apply;
  d.staleness = version > base_version ? version - base_version : 0;
  return d;
}

adsp_planner::adsp_planner(adsp_config cfg)
  : cfg_(cfg), period_(std::clamp(cfg.initial_period_s, cfg.min_period_s, cfg.max_period_s)),
    velocity_(cfg.step) {
}

std::map<worker_id, uint32_t> adsp_planner::local_steps(const std::map<worker_id, double>& iteration_s) const {
  std::map<worker_id, uint32_t> out;
  for (const auto& [w, t] : iteration_s) {
    double h = t > 0 ? std::round(period_ / t) : 1.0;
    out[w] = static_cast<uint32_t>(std::clamp(h, 1.0, static_cast<double>(cfg_.max_local_steps)));
  }
  return out;
}

void adsp_planner::observe(double t_s, double loss) {
  if (!std::isfinite(loss))
    return;
  if (!have_last_) {
    have_last_ = true;
    last_t_ = t_s;
    last_loss_ = loss;
    return;
  }
  double dt = t_s - last_t_;
  if (dt <= 0)
    return;
  double rate = (last_loss_ - loss) / dt; // loss drop per second: higher is better
  last_t_ = t_s;
  last_loss_ = loss;
  if (have_rate_) {
    // Keep going while progress improves; turn back (with momentum) when it worsens.
    double dir = rate >= last_rate_ ? (velocity_ >= 0 ? 1.0 : -1.0) : (velocity_ >= 0 ? -1.0 : 1.0);
    velocity_ = cfg_.momentum * velocity_ + (1 - cfg_.momentum) * dir * cfg_.step;
    period_ = std::clamp(period_ * (1 + velocity_), cfg_.min_period_s, cfg_.max_period_s);
  }
  have_rate_ = true;
  last_rate_ = rate;
}

void adsp_job_planner::on_tick(const planner_view& view, job_plan& out) {
  planner_.observe(view.t_s, view.loss);
  std::map<worker_id, double> times;
  for (const auto& w : view.workers)
    times[w.id] = w.compute_s;
  plan_local_steps(sent_, planner_.local_steps(times), out);
  out.debug.push_back(fmt::format("adsp commit period {:.3f} s", planner_.period()));
}

}  // namespace ashlar
