#include "runtime/policy/batch_planner.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/config/train_config.hpp"

namespace ashlar {

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
