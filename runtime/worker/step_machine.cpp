// The worker's step machine (runtime/worker/step_machine.hpp), in four files: this one
// (construction, actions, the lifecycle, lost shards, plans from the scheduler), the
// transfer core every mode shares (step_transfer.cpp: the step, pulls, pushes, reports),
// local steps and commits (step_local.cpp), and the ring all-reduce (step_ring.cpp).
#include "runtime/worker/step_machine.hpp"

#include <limits>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/optim/local_steps.hpp"
#include "runtime/policy/assignment.hpp"
#include "runtime/optim/sgd.hpp"

namespace ashlar {

step_machine::step_machine(wire::assignment a, const dataset& data, uint64_t num_params, const clock_source& clock)
  : clock_(clock), data_(data), job_(std::move(a)), n_params_(num_params) {
  params_.assign(num_params, 0.0f);
  grad_.assign(num_params, 0.0f);
  base_versions_.assign(job_.shards.size(), 0);
  view_seqs_.assign(job_.shards.size(), 0);
  pull_ratio_ = job_.pull_topk_ratio;
  local_steps_ = std::max(1u, job_.local_steps);
  cursor_.emplace(data_, job_.data_begin, job_.data_count, job_.seed);
  if (job_.cursor_epoch > 0 || job_.cursor_pos > 0) {
    cursor_->seek(job_.cursor_epoch, job_.cursor_pos);
    spdlog::info("worker {}: resuming its data at pass {}, sample {} of [{}, {}), batch {}", job_.worker_id,
                 job_.cursor_epoch, job_.cursor_pos, job_.data_begin, job_.data_begin + job_.data_count,
                 job_.batch_size);
  }
}

caf::error step_machine::check(const wire::assignment& a, const model_spec& spec, const dataset& data) {
  if (a.shards.empty() || a.shards.back().end != spec.num_params())
    return make_error(errc::shape_mismatch, "the shard map does not cover the model's "
                                              + std::to_string(spec.num_params()) + " parameters");
  if (a.data_count == 0 || a.data_begin + a.data_count > data.n)
    return make_error(errc::invalid_config, "data share [" + std::to_string(a.data_begin) + ", "
                                              + std::to_string(a.data_begin + a.data_count) + ") exceeds the "
                                              + std::to_string(data.n) + " local training samples");
  if (data.dim != spec.input.size())
    return make_error(errc::shape_mismatch, "the data set's samples are " + data.shape.to_string()
                                              + ", the model expects " + spec.input.to_string());
  if (a.batch_size == 0)
    return make_error(errc::invalid_config, "batch size 0");
  return caf::none;
}

std::vector<step_action> step_machine::take_actions() {
  std::vector<step_action> out;
  out.swap(actions_);
  return out;
}

uint64_t step_machine::since(uint64_t t) const {
  const uint64_t now = clock_.steady_ns();
  return now > t ? now - t : 0;
}

uint64_t step_machine::chunk_size(uint64_t total) const {
  return job_.chunk_floats == 0 ? total : std::min<uint64_t>(job_.chunk_floats, total);
}

void step_machine::fail(const std::string& why) {
  if (stopped_)
    return;
  stopped_ = true;
  emit(step::fail{why});
}

void step_machine::finish(std::string reason) {
  stopped_ = true;
  spdlog::debug("worker {}: finished {} steps", job_.worker_id, step_);
  if (!compressors_.empty()) {
    double dense = 0, sent = 0;
    for (const auto& c : compressors_) {
      dense += static_cast<double>(c.dense_bytes());
      sent += static_cast<double>(c.sent_bytes());
    }
    spdlog::info("worker {}: top-k pushes sent {:.1f} MB for {:.1f} MB of gradients (compression ratio {:.1f})",
                 job_.worker_id, sent / 1e6, dense / 1e6, sent > 0 ? dense / sent : 1.0);
  }
  if (pull_sent_bytes_ > 0)
    spdlog::info("worker {}: delta pulls received {:.1f} MB for {:.1f} MB of parameters (compression ratio {:.1f})",
                 job_.worker_id, pull_sent_bytes_ / 1e6, pull_dense_bytes_ / 1e6,
                 static_cast<double>(pull_dense_bytes_) / static_cast<double>(pull_sent_bytes_));
  const bool early = step_ < job_.steps;
  if (reason.empty())
    reason = early ? std::string{wire::stopped_on_request} + " after " + std::to_string(step_) + " steps"
                   : "finished " + std::to_string(step_) + " steps";
  emit(step::finish{std::move(reason), early});
}

void step_machine::begin() {
  started_ns_ = clock_.steady_ns();
  // Ring jobs take the ring mode now: a gradient computed before the ring is formed
  // waits for it rather than going to the shards.
  if (traits_of(job_.policy).ring)
    switch_mode(step_mode::ring);
  else if (local_steps_ > 1)
    switch_mode(step_mode::local_steps);
  emit(step::next_step{});
}

void step_machine::switch_mode(step_mode m) {
  mode_ = m;
  model_local_ = false; // the first step in the new mode pulls
}

// -- lost shards ------------------------------------------------------------------------

void step_machine::shard_trouble(size_t i, const std::string& why) {
  if (stopped_)
    return;
  if (job_.shard_wait_s <= 0)
    return fail(why);
  if (mode_ == step_mode::ring && ring_shard_trouble(i, why))
    return;
  if (i < view_seqs_.size())
    view_seqs_[i] = 0; // a replacement shard knows no view of this worker
  if (lost_.insert(i).second)
    spdlog::warn("worker {}: {}; waiting up to {:.0f} s for shard {} to be served again", job_.worker_id, why,
                 job_.shard_wait_s, job_.shards[i].shard_id);
  if (!suspended_) {
    suspended_ = true;
    emit(step::await_shard{static_cast<uint64_t>(job_.shard_wait_s * 1000), gen_});
  }
}

void step_machine::on_request_failed(size_t i, uint64_t gen, const std::string& why) {
  if (gen == gen_)
    shard_trouble(i, why);
}

void step_machine::on_shard_down(size_t i, const std::string& why) {
  shard_trouble(i, why);
}

void step_machine::on_shard_wait_over(uint64_t gen) {
  if (suspended_ && gen_ == gen && !lost_.empty())
    fail("shard " + std::to_string(job_.shards[*lost_.begin()].shard_id) + " was lost and not served again within "
         + std::to_string(static_cast<int>(job_.shard_wait_s)) + " s");
}

void step_machine::on_shard_replaced(size_t i) {
  if (stopped_ || i >= job_.shards.size())
    return;
  lost_.erase(i);
  spdlog::info("worker {}: shard {} is served again", job_.worker_id, job_.shards[i].shard_id);
  if (!lost_.empty())
    return; // another shard is still missing
  if (mode_ == step_mode::ring && !suspended_)
    return; // the ring went on without it (rank 0 reads the mirror again after its next step)
  // The step under way (if any) may wait on the lost shard, even if no error said so
  // yet: it is abandoned (its replies and its pacing carry the old generation) and
  // starts over with a fresh pull. Between steps, the queued step goes on.
  const bool restart = suspended_ || in_step_ || deferred_step_;
  suspended_ = false;
  ++gen_;
  // An overlapped commit in flight is abandoned with the step; the next step pulls.
  commit_inflight_ = commit_due_ = deferred_step_ = model_local_ = false;
  last_follows_ = false; // the time without the shard is no host time
  given_ns_ = 0;         // and the abandoned step reports nothing
  if (restart) {
    in_step_ = false;
    pull_ns_ = wait_ns_ = step_bytes_ = step_dense_ = step_staleness_ = 0;
    emit(step::next_step{});
  }
}

// -- plans from the scheduler -------------------------------------------------------------

void step_machine::on_stop() {
  // Finish the step in flight; the next step boundary leaves.
  stop_requested_ = true;
  // On a ring: a member waiting for a ring (others left) has no all-reduce to vote in.
  if (!stopped_ && mode_ == step_mode::ring && ring_waiting_)
    finish();
}

void step_machine::on_batch(uint32_t batch, uint64_t from_step, uint64_t data_begin, uint64_t data_count,
                            uint64_t steps) {
  ++directives_;
  if (batch == 0)
    return;
  // A membership change: the new part from step `from_step`, or at once if this worker
  // took more steps meanwhile, corrected for them (a ring keeps its members' steps equal,
  // as planned, and switches at its next step).
  const uint64_t taken = step_ + (in_step_ ? 1 : 0);
  if (steps > 0 && mode_ != step_mode::ring) {
    const double old_step = step_samples(member_part{job_.batch_size, job_.data_begin, job_.data_count, 0});
    const double new_step = step_samples(member_part{batch, data_begin, data_count, 0});
    const uint64_t planned = steps;
    steps = steps_after_directive(steps, from_step, taken, old_step, new_step);
    if (taken > from_step)
      spdlog::info("worker {}: a membership directive for step {} came after step {}: {} steps in all, not {} (its "
                   "steps since trained its old part)",
                   job_.worker_id, from_step, taken, steps, planned);
  }
  if (steps > 0 && steps != job_.steps) {
    spdlog::info("worker {}: trains {} steps in all (was {}): the job's membership changed", job_.worker_id,
                 steps, job_.steps);
    job_.steps = steps;
  }
  // This part replaces those planned from its step on.
  const uint64_t from = steps > 0 && (mode_ == step_mode::ring || taken > from_step) ? 0 : from_step;
  while (!next_parts_.empty() && next_parts_.back().from >= from)
    next_parts_.pop_back();
  next_parts_.push_back(part_change{from, batch, data_begin, data_count});
}

void step_machine::on_local_steps(uint32_t h) {
  if (h != local_steps_)
    spdlog::debug("worker {}: {} local steps per commit", job_.worker_id, h);
  local_steps_ = std::max(1u, h);
  if (mode_ == step_mode::every_step && stage_.empty() && local_steps_ > 1)
    switch_mode(step_mode::local_steps);
}

void step_machine::on_stage(const std::string& stage, uint32_t h, float lr_scale, float pull_ratio) {
  stage_ = stage;
  local_lr_scale_ = lr_scale;
  if (pull_ratio != pull_ratio_) {
    pull_ratio_ = pull_ratio;
    if (pull_ratio > 0)
      spdlog::info("worker {}: pulls are delta reads of {:.0f}% of each range from now on", job_.worker_id,
                   100.0 * pull_ratio);
  }
  local_steps_ = std::max(1u, h);
  ++stage_changes_;
  const auto next = stage == "profiling" ? step_mode::every_step : step_mode::local_steps;
  spdlog::info("worker {}: stage {} from step {} (change {}): {}", job_.worker_id, stage, step_, stage_changes_,
               next == step_mode::every_step ? "every step a commit"
                                             : std::to_string(local_steps_) + " local steps per commit");
  switch_mode(next);
}

caf::error step_machine::take_data_part(uint64_t begin, uint64_t count) {
  if (count == 0 || (begin == job_.data_begin && count == job_.data_count))
    return caf::none;
  if (begin + count > data_.n)
    return make_error(errc::invalid_config, "the scheduler moved this worker to samples [" + std::to_string(begin)
                                              + ", " + std::to_string(begin + count) + "), beyond the "
                                              + std::to_string(data_.n) + " local training samples");
  job_.data_begin = begin;
  job_.data_count = count;
  cursor_.emplace(data_, begin, count, job_.seed + step_);
  return caf::none;
}

}  // namespace ashlar
