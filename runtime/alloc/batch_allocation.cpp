#include "runtime/alloc/batch_allocation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/config/train_config.hpp"

namespace ashlar {

expected<std::vector<uint32_t>> equal_shares(uint32_t global, size_t workers) {
  if (workers == 0 || global < workers)
    return make_error(errc::invalid_argument, "cannot split a batch of " + std::to_string(global) + " over "
                                                + std::to_string(workers) + " workers (each needs at least 1)");
  std::vector<uint32_t> out(workers, static_cast<uint32_t>(global / workers));
  for (size_t i = 0; i < global % workers; ++i)
    ++out[i];
  return out;
}

expected<std::vector<uint32_t>> proportional_shares(uint32_t global, const std::vector<double>& speeds) {
  const size_t n = speeds.size();
  if (n == 0 || global < n)
    return make_error(errc::invalid_argument, "cannot split a batch of " + std::to_string(global) + " over "
                                                + std::to_string(n) + " workers (each needs at least 1)");
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!(speeds[i] > 0) || !std::isfinite(speeds[i]))
      return make_error(errc::invalid_argument, "worker " + std::to_string(i) + " has speed "
                                                  + std::to_string(speeds[i]) + "; speeds must be > 0");
    total += speeds[i];
  }
  // Each worker's exact proportional part, rounded down but at least 1; what is left (or
  // over, from the minimum of 1) is settled by largest (smallest) remainder.
  std::vector<uint32_t> out(n);
  std::vector<std::pair<double, size_t>> remainder(n);
  int64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    double exact = global * speeds[i] / total;
    out[i] = std::max<uint32_t>(1, static_cast<uint32_t>(std::floor(exact)));
    given += out[i];
    remainder[i] = {exact - out[i], i};
  }
  std::sort(remainder.begin(), remainder.end(),
            [](const auto& x, const auto& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
  for (size_t j = 0; given < global; ++j, ++given)
    ++out[remainder[j % n].second];
  for (size_t j = n; given > global; --j) {
    size_t i = remainder[(j - 1) % n].second;
    if (out[i] > 1) {
      --out[i];
      --given;
    }
    if (j == 1)
      j = n + 1;
  }
  return out;
}

adaptive_allocator::adaptive_allocator(uint32_t global, size_t workers, double alpha)
  : global_(global), alpha_(std::clamp(alpha, 1e-6, 1.0)), speed_(workers, 0.0) {
}

void adaptive_allocator::observe(size_t worker, uint32_t batch, double seconds) {
  if (worker >= speed_.size() || batch == 0 || !(seconds > 0) || !std::isfinite(seconds))
    return;
  double s = batch / seconds;
  speed_[worker] = speed_[worker] == 0 ? s : alpha_ * s + (1 - alpha_) * speed_[worker];
}

std::vector<uint32_t> adaptive_allocator::shares() const {
  bool all = std::all_of(speed_.begin(), speed_.end(), [](double s) { return s > 0; });
  auto out = all ? proportional_shares(global_, speed_) : equal_shares(global_, speed_.size());
  return out ? *out : std::vector<uint32_t>(speed_.size(), 1);
}

expected<allocation_mode> parse_allocation(const std::string& name) {
  if (name == "equal")
    return allocation_mode::equal;
  if (name == "proportional")
    return allocation_mode::proportional;
  if (name == "adaptive")
    return allocation_mode::adaptive;
  if (name == "predicted")
    return allocation_mode::predicted;
  return make_error(errc::invalid_config,
                    "train.allocation '" + name + "' is not known (known: equal, proportional, adaptive, predicted)");
}

const char* to_string(allocation_mode m) {
  switch (m) {
    case allocation_mode::equal:
      return "equal";
    case allocation_mode::proportional:
      return "proportional";
    case allocation_mode::adaptive:
      return "adaptive";
    case allocation_mode::predicted:
      return "predicted";
  }
  return "equal";
}

batch_planner::batch_planner(allocation_mode mode, const planner_context& ctx)
  : mode_(mode), batch_size_(ctx.job->batch_size), train_size_(ctx.train_size), lockstep_(ctx.lockstep) {
  if (mode_ != allocation_mode::proportional || ctx.resume_batches.empty())
    return;
  // Shares profiled once per job: a resumed job keeps the checkpointed job's, when they
  // cover every expected worker and add up to the global batch.
  uint64_t sum = 0;
  std::string text;
  for (uint32_t id = 0; id < ctx.job->workers; ++id) {
    auto r = ctx.resume_batches.find(id);
    if (r == ctx.resume_batches.end() || r->second == 0)
      return;
    sum += r->second;
    text += (text.empty() ? "" : ", ") + std::to_string(id) + ":" + std::to_string(r->second);
  }
  if (sum == uint64_t{batch_size_} * ctx.job->workers) {
    frozen_ = true;
    restored_ = text;
  }
}

void batch_planner::on_start(job_plan& out) {
  if (!restored_.empty())
    out.info.push_back("batch shares restored from the checkpointed job: " + restored_);
}

void batch_planner::on_resumed(worker_id w, const batch_directive& batch) {
  sent_[w] = batch;
}

void batch_planner::on_tick(const planner_view& view, job_plan& out) {
  if (frozen_)
    return;
  std::vector<worker_id> ids;
  std::vector<double> speeds;
  uint64_t max_steps = 0;
  std::map<worker_id, uint64_t> steps;
  for (const auto& w : view.workers) {
    if (w.steps < 3 || w.compute_per_sample <= 0)
      continue;
    double per_sample = w.compute_per_sample;
    if (mode_ == allocation_mode::predicted) {
      auto& p = predictors_[w.id];
      p.observe(per_sample);
      per_sample = std::max(1e-9, p.predict());
    }
    ids.push_back(w.id);
    speeds.push_back(1.0 / per_sample);
    steps[w.id] = w.steps;
    max_steps = std::max(max_steps, w.steps);
  }
  if (ids.empty() || ids.size() < view.live_members)
    return; // not every worker measured yet
  auto global = static_cast<uint32_t>(uint64_t{batch_size_} * ids.size());
  auto shares = proportional_shares(global, speeds);
  if (!shares)
    return;
  std::string text;
  bool changed = false;
  uint64_t begin = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint64_t end = i + 1 == ids.size() ? train_size_ : begin + train_size_ * (*shares)[i] / global;
    batch_directive d;
    d.share = (*shares)[i];
    d.data_begin = std::min(begin, train_size_ > 0 ? train_size_ - 1 : 0);
    d.data_count = std::max<uint64_t>(1, end - begin);
    text += (text.empty() ? "" : ", ") + std::to_string(ids[i]) + ":" + std::to_string(d.share) + " ["
            + std::to_string(begin) + ", " + std::to_string(end) + ")";
    begin = end;
    auto& last = sent_[ids[i]];
    if (last.share == d.share && last.data_begin == d.data_begin && last.data_count == d.data_count)
      continue;
    changed = true;
    d.from_step = lockstep_ ? max_steps + 3 : steps[ids[i]] + 1;
    last = d;
    out.batches[ids[i]] = d;
  }
  if (changed)
    out.events.push_back(plan_event{"batch shares", text});
  if (mode_ == allocation_mode::proportional) {
    frozen_ = true;
    out.info.push_back("batch shares from profiled speed: " + text);
  } else {
    out.debug.push_back("batch shares: " + text);
  }
}

}  // namespace ashlar
