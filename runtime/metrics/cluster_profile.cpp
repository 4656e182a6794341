#include "runtime/metrics/cluster_profile.hpp"

#include <cmath>

#include "runtime/metrics/metric_target.hpp"

namespace ashlar {

namespace {

double ema(double old, double x, double alpha, bool first) {
  return first ? x : (1 - alpha) * old + alpha * x;
}

}  // namespace

cluster_profile::cluster_profile(double alpha, double window, const clock_source& clock)
  : alpha_(alpha), window_(window), clock_(clock) {
}

// Closes a worker's speed window once it is `window` seconds long: the GRU's prediction
// for it is scored against what was observed, then the GRU learns the window.
void cluster_profile::close_window(track& t, uint64_t now) {
  if (static_cast<double>(now - t.window_start) * 1e-9 < window_ || t.window_samples <= 0 || t.window_compute <= 0)
    return;
  const double per_sample = t.window_compute / t.window_samples;
  const double predicted = t.predictor.predict();
  if (predicted > 0) {
    t.error_sum += std::abs(predicted - per_sample) / per_sample;
    ++t.predicted_windows;
    t.stats.prediction_error = t.error_sum / static_cast<double>(t.predicted_windows);
  }
  t.predictor.observe(per_sample);
  t.stats.observed_speed = 1.0 / per_sample;
  t.stats.predicted_speed = t.predictor.predict() > 0 ? 1.0 / t.predictor.predict() : 0.0;
  t.window_start = now;
  t.window_samples = t.window_compute = 0;
}

// Why report `r` is not taken, or nothing.
std::optional<std::string> cluster_profile::refusal(const wire::profile_report& r) const {
  auto i = workers_.find(r.worker_id);
  if (i == workers_.end() || !i->second.member)
    return "worker " + std::to_string(r.worker_id) + " is not a member of the job";
  if (step_samples_max_ > 0 && r.samples > step_samples_max_)
    return "worker " + std::to_string(r.worker_id) + " reported " + std::to_string(r.samples)
           + " samples in one step, more than the training set's " + std::to_string(step_samples_max_);
  if (i->second.stepped && r.step <= i->second.last_step)
    return "worker " + std::to_string(r.worker_id) + " reported step " + std::to_string(r.step)
           + " after step " + std::to_string(i->second.last_step);
  return std::nullopt;
}

std::optional<std::string> cluster_profile::observe(const wire::profile_report& r) {
  if (auto why = refusal(r)) {
    ++refused_;
    return why;
  }
  const uint64_t now = clock_.steady_ns();
  if (!started_) {
    start_ = now;
    started_ = true;
  }
  auto& t = workers_[r.worker_id];
  auto& s = t.stats;
  const bool first = !t.seen;
  t.last_step = r.step;
  t.stepped = true;
  if (first)
    t.window_start = now;
  t.seen = true;
  s.worker_id = r.worker_id;
  s.steps += 1;
  s.samples += r.samples;
  if (s.steps >= 2) {
    const bool seed = s.steps == 2;
    double step_s = static_cast<double>(r.compute_ns + r.pull_ns + r.push_ns + r.wait_ns) * 1e-9;
    s.step_seconds = ema(s.step_seconds, step_s, alpha_, seed);
    s.compute_seconds = ema(s.compute_seconds, static_cast<double>(r.compute_ns) * 1e-9, alpha_, seed);
    s.wait_seconds = ema(s.wait_seconds, static_cast<double>(r.wait_ns) * 1e-9, alpha_, seed);
    double rate = step_s > 0 ? r.samples / step_s : 0;
    s.samples_per_second = ema(s.samples_per_second, rate, alpha_, seed);
    if (r.samples > 0)
      s.compute_per_sample = ema(s.compute_per_sample, static_cast<double>(r.compute_ns) * 1e-9 / r.samples, alpha_,
                                 seed || s.compute_per_sample <= 0);
  }
  // A non-finite loss shows at once; the next finite one starts the average over.
  s.loss = ema(s.loss, r.loss, alpha_, first || !std::isfinite(s.loss) || !std::isfinite(r.loss));
  s.total_compute_seconds += static_cast<double>(r.compute_ns) * 1e-9;
  s.total_wait_seconds += static_cast<double>(r.wait_ns) * 1e-9;
  s.bytes += r.bytes;
  s.dense_bytes += r.dense_bytes;
  s.stage_changes = r.stage_changes;
  s.steps_target = r.steps_target;
  s.directives = r.directives;
  s.batch = r.batch;
  s.position = r.position;
  // A step that pushed (push time), or during which an overlapped commit landed (the
  // shards' acknowledged staleness; its push time is hidden behind local steps).
  if (r.push_ns > 0 || r.staleness > 0)
    s.staleness = ema(s.staleness, static_cast<double>(r.staleness), alpha_, s.staleness == 0);
  t.window_samples += r.samples;
  t.window_compute += static_cast<double>(r.compute_ns) * 1e-9;
  close_window(t, now);
  total_samples_ += r.samples;
  // A report's metrics, as far as they are well named (a worker's own backend may send
  // anything: the names go into JSON keys and Prometheus labels), at most 64.
  std::vector<wire::named_value> named;
  for (const auto& m : r.metrics)
    if (named.size() < 64 && !metric_name_error(m.name))
      named.push_back(m);
  if (!named.empty()) {
    if (reports_.size() >= kept_reports)
      reports_.erase(reports_.begin());
    reports_.push_back({++reports_seen_, r.worker_id, total_samples_, static_cast<double>(now - start_) * 1e-9,
                        std::move(named)});
  }
  loss_ = ema(loss_, r.loss, alpha_ / 2, !loss_seen_ || !std::isfinite(loss_) || !std::isfinite(r.loss));
  loss_seen_ = true;
  return std::nullopt;
}

void cluster_profile::membership(uint32_t worker, bool done) {
  auto& t = workers_[worker];
  t.stats.worker_id = worker;
  t.stats.done = done;
  t.member = !done;
  t.stepped = false; // a worker that joins again under its id counts its steps anew
}

wire::cluster_stats cluster_profile::stats() const {
  wire::cluster_stats out;
  for (const auto& [id, t] : workers_)
    out.workers.push_back(t.stats);
  out.total_samples = total_samples_;
  out.loss = loss_;
  out.metric_reports = reports_;
  out.refused_reports = refused_;
  if (started_)
    out.elapsed_seconds = static_cast<double>(clock_.steady_ns() - start_) * 1e-9;
  return out;
}

}  // namespace ashlar
