#include "runtime/control/job_timeline.hpp"

#include <algorithm>

namespace ashlar::control {

job_timeline::job_timeline(const clock_source& clock, timeline_settings s) : clock_(clock), s_(s) {
  start_ns_ = clock_.steady_ns();
  next_epoch_ = s_.epoch_samples > 0 ? static_cast<uint32_t>(s_.done_before / s_.epoch_samples + 1) : 1;
}

void job_timeline::training_started() {
  if (training_)
    return;
  training_ = true;
  start_ns_ = clock_.steady_ns();
  last_progress_ = last_eval_ = last_note_ = 0;
  last_metrics_ = -1;
  last_look_ = -1;
  rate_ = 0;
}

double job_timeline::seconds() const { return static_cast<double>(clock_.steady_ns() - start_ns_) * 1e-9; }

void job_timeline::shard_lost(size_t index) { lost_ns_.emplace(index, clock_.steady_ns()); }

timeline_duties job_timeline::look(uint64_t samples) {
  timeline_duties d;
  const double now = seconds();
  // The rate, for the next boundary's prediction.
  if (last_look_ >= 0 && now > last_look_ && samples >= last_samples_)
    rate_ = static_cast<double>(samples - last_samples_) / (now - last_look_);
  last_look_ = now;
  last_samples_ = samples;
  const uint64_t trained = s_.done_before + samples;
  if (training_) {
    if (s_.progress_interval > 0 && now - last_progress_ >= s_.progress_interval) {
      d.progress = true;
      last_progress_ = now;
    }
    const bool epoch_due = s_.eval_every_epoch && next_epoch_ < s_.epochs
                           && trained >= uint64_t{next_epoch_} * s_.epoch_samples;
    d.interval_eval = s_.eval_interval > 0 && now - last_eval_ >= s_.eval_interval;
    d.evaluate = (epoch_due || d.interval_eval) && lost_ns_.empty();
  }
  if (now - last_note_ >= s_.note_every) {
    d.note = true;
    last_note_ = now;
  }
  if (s_.metrics_every > 0 && (last_metrics_ < 0 || now - last_metrics_ >= s_.metrics_every)) {
    d.metrics = true;
    last_metrics_ = now;
  }
  d.stop_budget = s_.stop_at_budget && s_.budget > 0 && trained >= s_.budget;
  d.stop_time = s_.time_limit > 0 && now >= s_.time_limit;
  d.shards_expired = expired_shards();
  d.stop_overdue = stop_overdue();
  return d;
}

void job_timeline::stop_asked() {
  if (stop_asked_ns_ == 0)
    stop_asked_ns_ = std::max<uint64_t>(clock_.steady_ns(), 1);
}

bool job_timeline::stop_overdue() const {
  return stop_asked_ns_ > 0 && static_cast<double>(clock_.steady_ns() - stop_asked_ns_) * 1e-9 >= s_.stop_grace;
}

std::vector<size_t> job_timeline::expired_shards() const {
  std::vector<size_t> out;
  const uint64_t now_ns = clock_.steady_ns();
  for (const auto& [index, since] : lost_ns_)
    if (static_cast<double>(now_ns - since) * 1e-9 > s_.shard_wait)
      out.push_back(index);
  return out;
}

void job_timeline::evaluation_started(bool interval, uint64_t samples) {
  const double now = seconds();
  // Interval evaluations keep to their grid (0.25, 0.5, ... s for 0.25), unless one still
  // running made them fall behind by more than an interval.
  last_eval_ = interval ? std::max(last_eval_ + s_.eval_interval, now - s_.eval_interval) : now;
  const uint64_t trained = s_.done_before + samples;
  while (next_epoch_ <= s_.epochs && trained >= uint64_t{next_epoch_} * s_.epoch_samples)
    ++next_epoch_;
}

uint64_t job_timeline::next_boundary() const {
  uint64_t b = 0;
  if (training_ && s_.eval_every_epoch && next_epoch_ < s_.epochs)
    b = uint64_t{next_epoch_} * s_.epoch_samples;
  if (s_.stop_at_budget && s_.budget > 0 && (b == 0 || s_.budget < b))
    b = s_.budget;
  return b;
}

double job_timeline::wait() const {
  const double now = seconds();
  double w = s_.max_wait;
  auto until = [&](double at) { w = std::min(w, at - now); };
  if (training_ && s_.progress_interval > 0)
    until(last_progress_ + s_.progress_interval);
  if (training_ && s_.eval_interval > 0)
    until(last_eval_ + s_.eval_interval);
  until(last_note_ + s_.note_every);
  if (s_.metrics_every > 0 && last_metrics_ >= 0)
    until(last_metrics_ + s_.metrics_every);
  if (s_.time_limit > 0)
    until(s_.time_limit);
  const uint64_t now_ns = clock_.steady_ns();
  for (const auto& [index, since] : lost_ns_)
    w = std::min(w, s_.shard_wait - static_cast<double>(now_ns - since) * 1e-9 + s_.min_wait);
  if (stop_asked_ns_ > 0)
    w = std::min(w, s_.stop_grace - static_cast<double>(now_ns - stop_asked_ns_) * 1e-9 + s_.min_wait);
  // The next boundary, where the rate says it comes; looked at again as it nears.
  if (const uint64_t b = next_boundary(); b > 0 && rate_ > 0 && last_look_ >= 0) {
    const uint64_t trained = s_.done_before + last_samples_;
    if (b > trained)
      until(last_look_ + static_cast<double>(b - trained) / rate_);
    else
      w = 0;
  }
  return std::clamp(w, s_.min_wait, s_.max_wait);
}

}  // namespace ashlar::control
