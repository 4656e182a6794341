#include "runtime/optim/divergence_guard.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/core/number_text.hpp"

namespace ashlar {

namespace {

std::string num(double v) { return number_text("%.4g", v); }

}  // namespace

divergence_guard::divergence_guard(divergence_settings s) : s_(s) {}

divergence_guard::action divergence_guard::observe(double loss, double now, uint64_t samples) {
  samples_ = samples;
  if (now < settle_until_)
    return action::none;
  auto diverged = [&](std::string why) {
    strikes_ = 0;
    why_ = std::move(why);
    return backoffs_ >= s_.max_backoffs ? action::give_up : action::back_off;
  };
  if (!std::isfinite(loss))
    return diverged("the training loss is not finite");
  if (!started_) {
    started_ = true;
    start_ = best_ = loss;
    since_ = samples;
    return action::none;
  }
  best_ = std::min(best_, loss);
  // Stuck near an untrained model's loss (a network that died): only a run that started
  // there, not a resumed one that starts low.
  const bool from_scratch = s_.start_hint > 0 && start_ >= 0.5 * s_.start_hint;
  const double untrained = std::min(start_, s_.start_hint);
  if (s_.patience_samples > 0 && from_scratch && best_ > 0.9 * untrained && samples >= since_ + s_.patience_samples)
    return diverged("the training loss has not fallen below 0.9x an untrained model's " + num(untrained) + " in "
                    + std::to_string(s_.patience_samples) + " samples");
  // Far above the start: 1.5x it and a nat more (a resumed job starts at a small loss,
  // whose noise is large against it). Most of the progress lost: only once it was real.
  const bool progressed = best_ < 0.6 * start_ && start_ - best_ >= 0.5;
  const double progress_limit = best_ + 0.75 * (start_ - best_);
  const bool high = loss > std::max(1.5 * start_, start_ + 1.0) || (progressed && loss > progress_limit);
  if (high) {
    if (++strikes_ >= 2)
      return diverged("the training loss rose to " + num(loss) + " (it started at " + num(start_) + ", best "
                      + num(best_) + ")");
    return action::none;
  }
  strikes_ = 0;
  const bool near_best = loss <= best_ + 0.25 * (start_ - best_);
  if (near_best && now - last_snapshot_ >= s_.snapshot_every_s)
    return action::snapshot;
  return action::none;
}

void divergence_guard::snapshot_taken(double loss, double now) {
  last_snapshot_ = now;
  snapshot_loss_ = loss;
}

void divergence_guard::backed_off(double now) {
  ++backoffs_;
  lr_scale_ *= 0.5;
  since_ = samples_;
  settle_until_ = now + s_.settle_s;
  strikes_ = 0;
  // The run goes on from the snapshot: its loss is the best to measure against.
  if (started_ && std::isfinite(snapshot_loss_) && snapshot_loss_ > 0)
    best_ = std::min(start_, snapshot_loss_);
}

loss_reading read_losses(const std::vector<std::pair<uint32_t, double>>& losses) {
  loss_reading r;
  double sum = 0;
  for (const auto& [worker, loss] : losses) {
    if (std::isfinite(loss)) {
      sum += loss;
      ++r.finite;
    } else {
      r.not_finite.push_back(worker);
    }
  }
  r.others = r.finite > 0 ? sum / static_cast<double>(r.finite) : 0;
  return r;
}

}  // namespace ashlar
