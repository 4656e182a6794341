#include "runtime/worker/step_machine.hpp"

#include <limits>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/optim/local_steps.hpp"
#include "runtime/optim/sgd.hpp"
#include "runtime/pacing/contention.hpp"

namespace ashlar {

namespace {

// Most step budgets of host time a paced worker owes itself (see pace_debt_ns_).
constexpr uint64_t pace_carry_steps = 4;

}  // namespace

step_machine::step_machine(wire::assignment a, const dataset& data, uint64_t num_params, const clock_source& clock)
  : clock_(clock), data_(data), job_(std::move(a)) {
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
  if (job_.policy == "ring")
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
  if (batch == 0)
    return;
  if (steps > 0 && steps != job_.steps) {
    spdlog::info("worker {}: trains {} steps in all (was {}): a lost member's share handed over", job_.worker_id,
                 steps, job_.steps);
    job_.steps = steps;
  }
  next_batch_ = batch;
  next_batch_from_ = from_step;
  next_data_ = {data_begin, data_count};
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

caf::error step_machine::take_data_part() {
  auto [begin, count] = next_data_;
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

// -- the step -----------------------------------------------------------------------------

void step_machine::on_step() {
  if (stopped_ || suspended_)
    return;
  // On a ring a member leaves after the all-reduce it voted to leave in, never in the
  // middle of one; once others left, one that is asked to leave too goes at once.
  const bool done =
    step_ >= job_.steps
    || (mode_ == step_mode::ring ? ring_leave_ || (ring_gen_ <= ring_await_ && stop_requested_) : stop_requested_);
  if (commit_inflight_ && (done || mode_ != step_mode::local_steps)) {
    last_follows_ = false; // waiting for the commit is the policy's time, not the host's
    deferred_step_ = true; // an overlapped commit lands first (commit_landed)
    return;
  }
  if (done)
    return finish();
  step_begin_ = clock_.steady_ns();
  if (last_follows_ && job_.pace_ns_per_sample > 0) {
    const uint64_t wall = step_begin_ > last_begin_ ? step_begin_ - last_begin_ : 0;
    if (wall > last_parts_ns_)
      pace_debt_ns_ = std::min(pace_debt_ns_ + (wall - last_parts_ns_),
                               pace_carry_steps * job_.pace_ns_per_sample * std::max<uint64_t>(batch_n_, 1));
  }
  last_follows_ = false;
  step_begin_wall_ = static_cast<uint64_t>(clock_.wall_ns());
  if (next_batch_ > 0 && step_ >= next_batch_from_) {
    job_.batch_size = next_batch_;
    next_batch_ = 0;
    if (auto err = take_data_part())
      return fail(describe(err));
  }
  in_step_ = true;
  if (mode_ == step_mode::ring && step_ > 0)
    compute_step(); // the model is local: compute, then all-reduce
  else if (mode_ == step_mode::ring) {
    ring_io_ = ring_io::first_pull; // the first step reads the model from the shards
    pull_all();
  } else if (local_done_ > 0 || commit_inflight_ || (mode_ == step_mode::local_steps && model_local_))
    compute_step(); // a commit is open, or one is in flight: compute on the local model
  else
    pull_all();
}

// Shard i's read is all here: once every shard's is, the step computes (or, for an
// overlapped commit, the pulled model lands behind the local steps).
void step_machine::pull_received() {
  if (--pending_ > 0)
    return;
  if (commit_inflight_)
    return commit_landed();
  if (ring_io_ == ring_io::mirror_read) {
    // Rank 0 of a ring: the shards take params -= (mirror - model), and the model stays.
    for (size_t j = 0; j < params_.size(); ++j)
      grad_[j] = params_[j] - before_[j];
    params_ = before_;
    mirror_push_ = true;
    push_samples_ = std::max<uint32_t>(batch_n_, 1);
    ring_io_ = ring_io::push;
    return send_pushes();
  }
  if (ring_io_ == ring_io::first_pull)
    ring_io_ = ring_io::none;
  uint64_t all = since(phase_start_);
  pull_ns_ = all > wait_ns_ ? all - wait_ns_ : 0;
  compute_step();
}

void step_machine::pull_all() {
  if (!commit_inflight_)
    held_current_ = false; // the pull replaces the model: the next held step sends it
  phase_start_ = clock_.steady_ns();
  wait_ns_ = 0;
  pending_ = job_.shards.size();
  transfers_.assign(job_.shards.size(), transfer{});
  for (size_t i = 0; i < job_.shards.size(); ++i) {
    transfers_[i].total = job_.shards[i].size();
    request_pull_chunk(i);
  }
}

// The first request starts the read; once the reply names it, further chunks are
// requested with at most chunks_in_flight outstanding per shard.
void step_machine::request_pull_chunk(size_t i) {
  auto& t = transfers_[i];
  wire::pull_request req{job_.worker_id, job_.shards[i].shard_id, false, t.next, job_.chunk_floats, t.read_id};
  if (pull_ratio_ > 0 && t.read_id == 0) {
    req.topk_ratio = pull_ratio_;
    req.view_seq = view_seqs_[i];
  }
  if (t.read_id != 0)
    t.next = std::min(t.total, t.next + chunk_size(t.total));
  emit(step::send_pull{i, gen_, req});
}

void step_machine::on_pull_reply(size_t i, uint64_t gen, const wire::pull_reply& r) {
  if (!current(gen) || i >= job_.shards.size())
    return;
  const auto& range = job_.shards[i];
  auto& t = transfers_[i];
  if (r.sparse)
    return delta_received(i, r);
  if (r.total != range.size() || r.begin != range.begin || r.offset + r.params.size() > range.size())
    return fail("shard " + std::to_string(range.shard_id) + " sent a chunk [" + std::to_string(r.offset) + ", +"
                + std::to_string(r.params.size()) + ") of " + std::to_string(r.total) + " at offset "
                + std::to_string(r.begin) + ", expected a range of " + std::to_string(range.size()) + " at "
                + std::to_string(range.begin));
  auto& target = commit_inflight_ ? pulled_ : params_;
  std::copy(r.params.begin(), r.params.end(), target.begin() + static_cast<std::ptrdiff_t>(range.begin + r.offset));
  step_bytes_ += r.params.size() * sizeof(float);
  step_dense_ += r.params.size() * sizeof(float);
  if (r.offset == 0)
    t.view_seq = r.view_seq;
  if (t.view_seq != 0) {
    // The shard keeps a view of this read: the mirror holds what it holds.
    if (mirror_.size() != params_.size())
      mirror_.resize(params_.size());
    std::copy(r.params.begin(), r.params.end(), mirror_.begin() + static_cast<std::ptrdiff_t>(range.begin + r.offset));
    pull_dense_bytes_ += r.params.size() * sizeof(float);
    pull_sent_bytes_ += r.params.size() * sizeof(float);
  }
  if (r.offset == 0) {
    // The first reply of a read: its version and wait, and the read's id.
    base_versions_[i] = r.version;
    if (!commit_inflight_)
      wait_ns_ = std::max(wait_ns_, r.wait_ns);
    t.read_id = r.read_id;
    t.next = r.params.size();
    for (uint32_t k = 0; k < std::max(1u, job_.chunks_in_flight) && t.next < t.total; ++k)
      request_pull_chunk(i);
  } else if (t.next < t.total) {
    request_pull_chunk(i);
  }
  t.done += r.params.size();
  if (t.done == t.total) {
    // The shard's view of this worker is this read, now that all of it is here.
    view_seqs_[i] = t.view_seq;
    pull_received();
  }
}

// A delta read from shard i: the entries sent go into the view's copy (the mirror), and
// the shard's range of the working parameters is that copy again.
void step_machine::delta_received(size_t i, const wire::pull_reply& r) {
  const auto& range = job_.shards[i];
  const auto shard = std::to_string(range.shard_id);
  // The read named the view this worker's mirror holds (only replies change it, one read
  // per shard at a time), so the delta applies to it even if the pull ratio has changed
  // since the request left.
  if (mirror_.size() != params_.size())
    return fail("shard " + shard + " sent a delta read the worker holds no view for");
  if (r.total != range.size() || r.begin != range.begin || r.offset != 0 || r.index.size() != r.params.size())
    return fail("shard " + shard + " sent a delta read of " + std::to_string(r.index.size()) + " indices and "
                + std::to_string(r.params.size()) + " values for a range of " + std::to_string(r.total) + " at "
                + std::to_string(r.begin) + ", expected " + std::to_string(range.size()) + " at "
                + std::to_string(range.begin));
  float* view = mirror_.data() + range.begin;
  for (size_t j = 0; j < r.index.size(); ++j) {
    if (r.index[j] >= range.size())
      return fail("shard " + shard + " sent a delta read with index " + std::to_string(r.index[j])
                  + " outside its range of " + std::to_string(range.size()));
    view[r.index[j]] = r.params[j];
  }
  auto& target = commit_inflight_ ? pulled_ : params_;
  std::copy(view, view + range.size(), target.begin() + static_cast<std::ptrdiff_t>(range.begin));
  base_versions_[i] = r.version;
  if (!commit_inflight_) // a pull behind the local steps holds no step up
    wait_ns_ = std::max(wait_ns_, r.wait_ns);
  view_seqs_[i] = r.view_seq;
  const uint64_t sent = r.index.size() * (sizeof(uint32_t) + sizeof(float));
  step_bytes_ += sent;
  step_dense_ += range.size() * sizeof(float);
  pull_sent_bytes_ += sent;
  pull_dense_bytes_ += range.size() * sizeof(float);
  auto& t = transfers_[i];
  t.done = t.next = t.total;
  pull_received();
}

// Computes the step's gradient (the actor runs the backend and answers on_computed).
void step_machine::compute_step() {
  compute_t0_ = clock_.steady_ns();
  compute_offset_ns_ = compute_t0_ > step_begin_ ? compute_t0_ - step_begin_ : 0;
  auto batch = cursor_->next(job_.batch_size);
  batch_n_ = static_cast<uint32_t>(batch.n);
  // A step on the local model (local steps, or a commit open or in flight) runs where
  // the model is kept.
  // (A commit opened by a step on this side, when local steps began while that step
  // waited out its pacing, goes to the backend with the model: that step pulled.)
  held_step_ = held_ && (mode_ == step_mode::local_steps || local_done_ > 0 || commit_inflight_)
               && (!commit_on_host_ || !held_current_);
  if (!held_step_) {
    step::compute c{batch};
    if (held_ && !velocity_on_host_ && job_.local_momentum > 0) {
      c.fetch_velocity = local_velocity_.data(); // the backend moved it last
      velocity_on_host_ = true;
    }
    return emit(c);
  }
  step::compute c{batch, true};
  if (!held_current_) {
    c.load = params_.data();
    if (velocity_on_host_)
      c.velocity = local_velocity_.data(); // steps on this side moved it last (or none: zero)
    if (commit_on_host_) {
      c.commit = acc_.data();
      commit_handed_ = true;
      commit_on_host_ = false;
    }
    held_current_ = true;
  }
  velocity_on_host_ = false;
  c.lr = local_lr();
  c.momentum = job_.local_momentum;
  emit(c);
}

void step_machine::set_model_held(bool held) {
  held_ = held;
  if (held) { // the buffers the backend reads and writes, sized once (the worker may lock them)
    commit_.resize(params_.size());
    pulled_.resize(params_.size());
    local_velocity_.assign(params_.size(), 0.0f);
  }
}

// A paced worker waits out the rest of its budget (batch x pace, slowed by contention)
// with a delayed message, never blocking a thread.
void step_machine::on_computed(const expected<batch_stats>& stats) {
  if (stopped_)
    return;
  if (!stats && is(stats.error(), errc::cancelled)) // the backend's owner stopped: leave, the step untaken
    return finish("its compute backend stopped taking steps after " + std::to_string(step_) + " steps ("
                  + describe(stats.error()) + ")");
  if (!stats && !is(stats.error(), errc::numerical_error)) {
    if (stopped_)
      return;
    stopped_ = true;
    return emit(step::fail{"step " + std::to_string(step_) + ": " + describe(stats.error()), true});
  }
  compute_ns_ = since(compute_t0_);
  if (!stats) {
    // A loss that is not finite: the step pushes nothing (a zero gradient, so rounds go
    // on) and reports the loss, for the job's divergence guard to back off; a job without
    // one stops on it.
    loss_ = std::numeric_limits<double>::quiet_NaN();
    std::fill(grad_.begin(), grad_.end(), 0.0f);
    std::fill(local_velocity_.begin(), local_velocity_.end(), 0.0f); // nor does the worker's momentum
    // Paused a tenth of a second, the job's tick: the guard backs off before the run
    // races through its budget on steps that train nothing.
    return emit(step::pace{100'000'000, gen_});
  } else {
    loss_ = stats->mean_loss();
  }
  uint64_t budget = job_.pace_ns_per_sample * batch_n_;
  if (budget > 0 && !job_.contention.empty()) {
    double t = static_cast<double>(since(started_ns_)) / 1e9;
    budget = static_cast<uint64_t>(static_cast<double>(budget) * slowdown(job_.contention, job_.worker_id, t));
  }
  if (budget > compute_ns_) {
    const uint64_t rest = budget - compute_ns_;
    const uint64_t give_back = std::min(rest, pace_debt_ns_);
    pace_debt_ns_ -= give_back;
    given_ns_ = give_back;
    compute_ns_ = budget;
    if (rest > give_back)
      return emit(step::pace{rest - give_back, gen_});
  }
  after_compute();
}

void step_machine::on_paced(uint64_t gen) {
  if (current(gen))
    after_compute();
}

// The learning rate of local steps, the stage's factor included.
float step_machine::local_lr() const {
  return job_.local_lr * local_lr_scale_ * schedule_lr_scale_;
}

// A local step: the step's gradient moves the local model (where the backend keeps the
// model, the step did).
void step_machine::step_local_model() {
  if (!held_step_)
    local_steps::move(params_.data(), grad_.data(), local_lr(), params_.size());
}

// Closes the open commit: its summed gradients times commit_scale go into `out` (the
// buffer its push reads), and the next commit starts empty. Where the backend keeps the
// model, it holds the sum: the commit is taken from it (with the velocity, when local
// steps end here, so steps on the worker's side go on from it), and the pushes wait for
// on_commit_taken. Returns whether `out` holds the commit now.
bool step_machine::take_commit(std::vector<float>& out) {
  const float scale = job_.commit_scale;
  push_samples_ = acc_samples_;
  acc_samples_ = 0;
  local_done_ = 0;
  if (!held_ || commit_on_host_) {
    out.resize(acc_.size());
    local_steps::take(out.data(), acc_.data(), scale, acc_.size());
    commit_on_host_ = false;
    return true;
  }
  out.resize(params_.size());
  step::take_commit t{out.data(), scale};
  if (mode_ != step_mode::local_steps && job_.local_momentum > 0) {
    local_velocity_.resize(params_.size());
    t.velocity_out = local_velocity_.data();
    velocity_on_host_ = true;
  }
  emit(t);
  return false;
}

void step_machine::on_commit_taken(const caf::error& err) {
  if (stopped_)
    return;
  if (err)
    return fail("taking the commit from the compute backend: " + describe(err));
  send_pushes();
  if (end_on_take_) { // an overlapped commit: its step ends once its pushes are out
    end_on_take_ = false;
    end_local_step();
  }
}

// With local steps in force, a step's gradient (its velocity, with local_momentum) is
// applied locally and added to the commit; the commit (the summed gradients) is pushed
// after local_steps steps, or at the last step. Otherwise the gradient is pushed at once
// (with a commit still open from local steps, as its last step).
void step_machine::after_compute() {
  if (mode_ == step_mode::ring)
    return ring_begin(); // (waits if the ring is not formed yet)
  if (job_.local_momentum > 0 && !held_step_) {
    // The worker's own momentum: from here on the step's update is its velocity.
    if (local_velocity_.size() != grad_.size())
      local_velocity_.assign(grad_.size(), 0.0f);
    local_steps::apply_momentum(grad_.data(), local_velocity_.data(), job_.local_momentum, grad_.size());
  }
  const uint32_t h = mode_ == step_mode::local_steps ? local_steps_ : 1;
  const bool overlap = job_.overlap_commits && mode_ == step_mode::local_steps;
  // (A step where the backend keeps the model added its update to the commit there.)
  if (!overlap && h <= 1 && local_done_ == 0 && !held_step_) {
    // Stopped while computing: the gradient is dropped, not pushed. The job's model is the
    // shards' at its stop, not one the slowest workers' last, stalest gradients move alone
    // once the others have left (asynchronous shards apply them one by one).
    if (stop_requested_)
      return finish();
    push_samples_ = batch_n_;
    if (job_.commit_scale != 1.0f)
      for (auto& g : grad_)
        g *= job_.commit_scale;
    return send_pushes();
  }
  if (!held_step_) {
    if (acc_.size() != grad_.size())
      acc_.assign(grad_.size(), 0.0f);
    local_steps::accumulate(acc_.data(), grad_.data(), grad_.size());
    commit_on_host_ = held_; // (where the backend keeps the model: its next step takes this along)
  } else if (commit_handed_) {
    std::fill(acc_.begin(), acc_.end(), 0.0f); // the backend has it now
    commit_handed_ = false;
  }
  acc_samples_ += batch_n_;
  ++local_done_;
  bool last = step_ + 1 >= job_.steps || stop_requested_;
  if (overlap) {
    // Every step moves the local model, a committing one too: the commit's pull comes
    // back later and takes the steps made meanwhile along (commit_landed).
    step_local_model();
    if (local_done_ >= h || last) {
      if (commit_inflight_) {
        // The last commit is still on its way: this step ends when it has landed.
        commit_due_ = true;
        due_since_ = clock_.steady_ns();
        return;
      }
      if (!begin_commit()) {
        end_on_take_ = true; // on_commit_taken ends the step
        return;
      }
    }
    return end_local_step();
  }
  if (local_done_ >= h || last) {
    if (take_commit(grad_))
      send_pushes();
    return;
  }
  // A local step: move the local model and go on without talking to the shards.
  step_local_model();
  report_step(0);
  end_step();
}

// Overlapped commits: sends the summed gradients of the steps since the last commit and
// goes on computing; the push's acknowledgements start the pull (phase_done), and the
// pull lands in commit_landed.
bool step_machine::begin_commit() {
  commit_inflight_ = true;
  model_local_ = true;
  pulled_.resize(params_.size());
  if (!take_commit(commit_))
    return false; // on_commit_taken sends them
  send_pushes();
  return true;
}

// The step is done; time spent waiting for a commit in flight counts as its push time.
void step_machine::end_local_step() {
  report_step(exposed_ns_);
  exposed_ns_ = 0;
  end_step();
}

// The pull after an overlapped commit is here: the local model is the pulled one minus
// the local steps taken since the commit (lr x their summed gradients, in acc). A step
// that waited for it (its commit due, a change of mode, or the finish) goes on.
void step_machine::commit_landed() {
  if (held_ && !commit_on_host_) {
    emit(step::rebase{pulled_.data(), local_lr()});
  } else {
    local_steps::rebase(params_.data(), pulled_.data(), acc_.data(), local_lr(), params_.size());
    held_current_ = false;
  }
  commit_inflight_ = false;
  if (commit_due_) {
    commit_due_ = false;
    exposed_ns_ += since(due_since_);
    if (!begin_commit()) {
      end_on_take_ = true;
      return;
    }
    return end_local_step();
  }
  if (deferred_step_) {
    deferred_step_ = false;
    emit(step::next_step{});
  }
}

void step_machine::send_pushes() {
  phase_start_ = clock_.steady_ns();
  pending_ = job_.shards.size();
  transfers_.assign(job_.shards.size(), transfer{});
  for (size_t i = 0; i < job_.shards.size(); ++i)
    transfers_[i].total = job_.shards[i].size();
  if (job_.topk_ratio > 0)
    return send_sparse_pushes();
  step_bytes_ += grad_.size() * sizeof(float);
  step_dense_ += grad_.size() * sizeof(float);
  for (size_t i = 0; i < job_.shards.size(); ++i)
    for (uint32_t k = 0; k < std::max(1u, job_.chunks_in_flight) && transfers_[i].next < transfers_[i].total; ++k)
      send_push_chunk(i);
}

// The slice of shard i is sent in chunks, chunks_in_flight outstanding at most.
void step_machine::send_push_chunk(size_t i) {
  const auto& range = job_.shards[i];
  auto& t = transfers_[i];
  uint64_t len = std::min(chunk_size(t.total), t.total - t.next);
  wire::push msg;
  msg.worker_id = job_.worker_id;
  msg.shard_id = range.shard_id;
  msg.base_version = base_versions_[i];
  msg.batch_size = push_samples_;
  msg.offset = t.next;
  msg.total = t.total;
  const auto& out = commit_inflight_ ? commit_ : grad_; // local steps overwrite grad
  auto from = out.begin() + static_cast<std::ptrdiff_t>(range.begin + t.next);
  msg.grad.assign(from, from + static_cast<std::ptrdiff_t>(len));
  t.next += len;
  emit(step::send_push{i, gen_, len, std::move(msg)});
}

// Top-k with error feedback: one sparse push per shard carries the largest entries of
// (gradient + residual); the rest stays in that shard's residual for the next push.
void step_machine::send_sparse_pushes() {
  if (compressors_.size() != job_.shards.size())
    compressors_.assign(job_.shards.size(), topk_compressor{job_.topk_ratio});
  for (size_t i = 0; i < job_.shards.size(); ++i) {
    const auto& range = job_.shards[i];
    const auto& out = commit_inflight_ ? commit_ : grad_;
    auto sparse = compressors_[i].compress(out.data() + range.begin, range.size());
    if (!sparse)
      return fail("compressing the push to shard " + std::to_string(range.shard_id) + ": "
                  + describe(sparse.error()));
    step_bytes_ += wire_bytes(*sparse);
    step_dense_ += range.size() * sizeof(float);
    wire::push msg;
    msg.worker_id = job_.worker_id;
    msg.shard_id = range.shard_id;
    msg.base_version = base_versions_[i];
    msg.batch_size = push_samples_;
    msg.total = range.size();
    msg.sparse = true;
    msg.index = std::move(sparse->index);
    msg.grad.assign(sparse->value.begin(), sparse->value.end());
    transfers_[i].next = transfers_[i].total;
    emit(step::send_push{i, gen_, transfers_[i].total, std::move(msg)});
  }
}

void step_machine::on_push_ack(size_t i, uint64_t gen, uint64_t floats, const wire::push_ack& ack) {
  if (mode_ == step_mode::ring && lost_.count(i) > 0)
    return; // its push was given up (ring_shard_trouble)
  if (current(gen) && i < transfers_.size())
    push_done(i, floats, ack);
}

// Shard i acknowledged `floats` more of the push: send the next chunk, or end the phase
// once every shard has the whole gradient.
void step_machine::push_done(size_t i, uint64_t floats, const wire::push_ack& ack) {
  step_staleness_ = std::max(step_staleness_, ack.staleness);
  auto& t = transfers_[i];
  t.done += floats;
  if (t.next < t.total)
    send_push_chunk(i);
  if (t.done == t.total && --pending_ == 0)
    phase_done();
}

// Every shard has the whole gradient: report the step and go on.
void step_machine::phase_done() {
  if (commit_inflight_)
    return pull_all(); // an overlapped commit's pushes are in: its pull follows
  if (mode_ == step_mode::ring)
    ring_io_ = ring_io::none;
  if (mirror_push_) // the mirror is the model again
    return mirror_done();
  report_step(since(phase_start_));
  end_step();
}

// The next step goes through the mailbox, so other messages are taken between steps.
void step_machine::end_step() {
  in_step_ = false;
  emit(step::next_step{});
}

// Reports the finished step to the profiler and counts it.
void step_machine::report_step(uint64_t push_ns) {
  wire::profile_report rep;
  rep.worker_id = job_.worker_id;
  rep.step = step_;
  rep.samples = batch_n_;
  rep.loss = loss_;
  rep.compute_ns = compute_ns_;
  rep.pull_ns = pull_ns_;
  rep.wait_ns = wait_ns_;
  rep.push_ns = push_ns;
  rep.bytes = step_bytes_;
  rep.dense_bytes = step_dense_;
  rep.stage_changes = stage_changes_;
  rep.start_ns = step_begin_wall_;
  rep.compute_offset_ns = compute_offset_ns_;
  rep.staleness = step_staleness_;
  rep.batch = job_.batch_size;
  rep.position = {job_.data_begin, job_.data_count, cursor_->seed(), cursor_->epoch(), cursor_->pos()};
  last_begin_ = step_begin_;
  last_parts_ns_ = rep.compute_ns + rep.pull_ns + rep.wait_ns + rep.push_ns - given_ns_;
  given_ns_ = 0;
  last_follows_ = true;
  pull_ns_ = wait_ns_ = step_bytes_ = step_dense_ = step_staleness_ = 0;
  ++step_;
  emit(step::report{rep});
}

// -- ring ---------------------------------------------------------------------------------
// Each step's gradient, weighted by the step's batch, is summed over the ring (its last
// three entries carry the batch, the count of members voting to leave and rank 0's
// learning-rate factor), divided by the ring's total batch and applied by every worker
// alike, so the replicas stay identical. Rank 0 then pushes the
// update to the shards, which mirror the model for evaluation.

void step_machine::on_ring(uint32_t generation, uint32_t rank, uint32_t ranks) {
  if (stopped_)
    return;
  if (rank >= ranks)
    return fail("the scheduler placed this worker at rank " + std::to_string(rank) + " of a ring of "
                + std::to_string(ranks));
  if (generation <= ring_gen_)
    return; // an older ring's place, overtaken
  ring_gen_ = generation;
  ring_rank_id_ = rank;
  ring_size_ = ranks;
  spdlog::debug("worker {}: rank {} of a ring of {} (generation {})", job_.worker_id, rank, ranks, generation);
  // What the old ring sent is of no use now; what the new one sent already waits here.
  ring_inbox_.erase(std::remove_if(ring_inbox_.begin(), ring_inbox_.end(),
                                   [&](const wire::ring_message& m) { return m.ring < generation; }),
                    ring_inbox_.end());
  if (mode_ != step_mode::ring)
    switch_mode(step_mode::ring);
  if (generation == 1) { // the job's first ring: every member pulled the same model
    ring_trained_ = 1;
    ring_round_ = 0;
  } else {
    ring_sync_due_ = true;
    if (ring_) { // the all-reduce in progress (or an earlier sync) is abandoned: start over
      ring_.reset();
      ring_sync_ = 0;
      return ring_begin();
    }
  }
  if (ring_waiting_)
    ring_begin();
}

void step_machine::on_ring_message(wire::ring_message m) {
  if (stopped_)
    return;
  if (m.ring < ring_gen_)
    return; // sent on a ring that has been re-formed since
  ring_inbox_.push_back(std::move(m));
  ring_drain();
}

void step_machine::ring_send_next() {
  if (auto m = ring_->next_send()) {
    wire::ring_message msg;
    msg.round = ring_sync_ ? 0 : ring_round_;
    msg.step = m->step;
    msg.chunk = m->chunk;
    msg.data.assign(m->data, m->data + m->size);
    msg.ring = ring_gen_;
    msg.sync = ring_sync_;
    emit(step::ring_send{std::move(msg)});
  }
}

// How far a member got, in the first sync round: the generation it last all-reduced in
// and the all-reduces it completed there (in two floats, each exact below 2^24).
constexpr uint64_t ring_round_split = 1u << 20;

void step_machine::ring_sync_done() {
  const auto& v = ring_->values();
  const size_t n = params_.size();
  if (ring_sync_ == 1) {
    // Every member's progress is known: the lowest rank of those furthest on is the source.
    auto at = [&](uint32_t r) {
      return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(v[3 * r]),
                                           static_cast<uint64_t>(v[3 * r + 1]) * ring_round_split
                                             + static_cast<uint64_t>(v[3 * r + 2])};
    };
    ring_source_ = 0;
    for (uint32_t r = 1; r < ring_size_; ++r)
      if (at(r) > at(ring_source_))
        ring_source_ = r;
    const auto furthest = at(ring_source_);
    const std::pair<uint64_t, uint64_t> mine{ring_trained_, ring_round_};
    ring_behind_ = mine < furthest;
    ring_step_up_ = ring_behind_ && mine.first == furthest.first ? furthest.second - mine.second : 0;
    // Every member applied the same all-reduces: their models are the same. (Not members
    // that all joined, each with a pull of its own.)
    bool level = furthest.first > 0;
    for (uint32_t r = 0; r < ring_size_; ++r)
      level = level && at(r) == furthest;
    if (level) { // (a member that left on request, after its last all-reduce): no state to share
      ring_.reset();
      ring_sync_ = 0;
      return ring_synced();
    }
    std::vector<float> state(2 * n, 0.0f);
    if (ring_rank_id_ == ring_source_) {
      std::copy(params_.begin(), params_.end(), state.begin());
      if (velocity_.size() == n)
        std::copy(velocity_.begin(), velocity_.end(), state.begin() + static_cast<std::ptrdiff_t>(n));
    }
    ring_sync_ = 2;
    return ring_start(std::move(state));
  }
  // Round 2: the source's parameters and velocity (everyone else added zeros).
  if (ring_rank_id_ != ring_source_) {
    std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n), params_.begin());
    velocity_.assign(v.begin() + static_cast<std::ptrdiff_t>(n), v.begin() + static_cast<std::ptrdiff_t>(2 * n));
  }
  ring_.reset();
  ring_sync_ = 0;
  ring_synced();
}

// The members of a re-formed ring agree on the model: it counts as this ring's, and the
// step goes on (rank 0 first sets the shards' mirror to it).
void step_machine::ring_synced() {
  ring_trained_ = ring_gen_;
  ring_round_ = 0;
  if (ring_step_up_ > 0) {
    // The step whose all-reduce the loss cut short counts as done, as for the others.
    spdlog::info("worker {}: the re-formed ring goes on from the model of its furthest member, {} step(s) ahead",
                 job_.worker_id, ring_step_up_);
    step_ += ring_step_up_;
  }
  if (ring_rank_id_ == 0 && lost_.empty())
    return read_mirror(true); // the lost rank 0 may have died halfway through a push
  if (ring_rank_id_ == 0)
    mirror_stale_ = true; // read once the shards are back
  if (ring_behind_)
    return compute_step(); // its gradient was of another model
  ring_begin();
}

// Rank 0 reads the shards' mirror and pushes what differs from the model; then computes
// (`then_compute`: its gradient buffer carried the difference) or ends the step.
void step_machine::read_mirror(bool then_compute) {
  before_ = params_;
  mirror_then_compute_ = then_compute;
  mirror_stale_ = false;
  ring_io_ = ring_io::mirror_read;
  pull_all();
}

void step_machine::mirror_done() {
  mirror_push_ = false;
  ring_io_ = ring_io::none;
  if (mirror_then_compute_)
    return compute_step();
  report_step(since(phase_start_));
  end_step();
}

// A shard lost under a ring: the workers hold the model and train on without it; only
// the first step's pull waits for it (as under the other policies). Rank 0 gives up
// pushing to it and reads the whole mirror again after its first step with every shard
// back (a shard served again is at the job's last committed cut). True if handled here.
bool step_machine::ring_shard_trouble(size_t i, const std::string& why) {
  if (ring_io_ == ring_io::first_pull)
    return false;
  if (lost_.insert(i).second)
    spdlog::warn("worker {}: {}; the ring trains on without shard {} (waiting up to {:.0f} s for it to be served "
                 "again)",
                 job_.worker_id, why, job_.shards[i].shard_id, job_.shard_wait_s);
  if (ring_rank_id_ == 0)
    mirror_stale_ = true;
  if (ring_io_ == ring_io::mirror_read) { // given up: the model stays, the read comes later
    ++gen_;                               // (the other shards' replies are of no use now)
    params_ = before_;
    mirror_stale_ = true;
    mirror_done();
  } else if (ring_io_ == ring_io::push && i < transfers_.size()) {
    auto& t = transfers_[i];
    if (t.done < t.total) {
      t.done = t.next = t.total;
      if (--pending_ == 0)
        phase_done();
    }
  }
  return true;
}

void step_machine::ring_finish() {
  if (ring_sync_)
    return ring_sync_done();
  ++ring_round_;
  const auto& v = ring_->values();
  const size_t n = params_.size();
  const float total = v[n];
  const float lr_scale = v[n + 2]; // rank 0's, the same for every member
  // The votes to leave: this member's own leaves now; anyone else's leaves a gap the
  // scheduler fills with a new ring, which the next all-reduce waits for.
  ring_leave_ = ring_vote_;
  if (v[n + 1] > (ring_vote_ ? 1.5f : 0.5f))
    ring_await_ = ring_gen_;
  // The all-reduce counts as waiting: it ends when the slowest worker's chunks came.
  wait_ns_ = since(phase_start_);
  phase_start_ = clock_.steady_ns();
  for (size_t j = 0; j < n; ++j)
    grad_[j] = v[j] / total;
  ring_.reset();
  if (velocity_.size() != n)
    velocity_.assign(n, 0.0f);
  sgd_config opt;
  opt.lr = job_.local_lr;
  opt.momentum = job_.momentum;
  opt.weight_decay = job_.weight_decay;
  if (ring_rank_id_ == 0)
    before_ = params_;
  sgd_apply(opt, lr_scale, params_.data(), velocity_.data(), grad_.data(), n);
  if (ring_rank_id_ != 0)
    return phase_done();
  if (!lost_.empty()) { // the mirror misses this update: read again once the shards are back
    mirror_stale_ = true;
    return phase_done();
  }
  if (mirror_stale_)
    return read_mirror(false);
  // The mirror: the shards take params -= (before - after).
  for (size_t j = 0; j < n; ++j)
    grad_[j] = before_[j] - params_[j];
  push_samples_ = static_cast<uint32_t>(total);
  ring_io_ = ring_io::push;
  send_pushes();
}

// Uses the chunks that have come for the current all-reduce step, in order.
void step_machine::ring_drain() {
  while (ring_ && !ring_inbox_.empty()) {
    auto& m = ring_inbox_.front();
    if (m.ring > ring_gen_)
      return; // a newer ring's, kept until this worker learns its place on it
    if (m.sync != ring_sync_ || (!ring_sync_ && m.round != ring_round_))
      return fail("ring: a chunk of all-reduce " + std::to_string(m.round) + (m.sync ? " (sync)" : "")
                  + " at all-reduce " + std::to_string(ring_round_) + (ring_sync_ ? " (sync)" : "")
                  + " of ring " + std::to_string(ring_gen_) + " (the ring is out of step)");
    auto err = ring_->receive(m.step, m.chunk, m.data.data(), m.data.size());
    ring_inbox_.pop_front();
    if (err)
      return fail("ring: " + describe(err));
    if (ring_->done())
      return ring_finish();
    ring_send_next();
  }
}

void step_machine::ring_start(std::vector<float> values) {
  ring_.emplace(ring_rank_id_, ring_size_, std::move(values));
  if (ring_->done())
    return ring_finish(); // a ring of one
  ring_send_next();
  ring_drain();
}

void step_machine::ring_begin() {
  if (ring_size_ == 0 || ring_gen_ <= ring_await_) {
    if (ring_gen_ <= ring_await_ && stop_requested_)
      return finish(); // asked to leave while the others left: no ring to wait for
    ring_waiting_ = true; // starts when the ring is formed (again)
    return;
  }
  ring_waiting_ = false;
  if (ring_sync_due_) {
    // A re-formed ring: first how far each member got (in entries of its own).
    ring_sync_due_ = false;
    ring_sync_ = 1;
    std::vector<float> progress(3 * ring_size_, 0.0f);
    progress[3 * ring_rank_id_] = static_cast<float>(ring_trained_);
    progress[3 * ring_rank_id_ + 1] = static_cast<float>(ring_round_ / ring_round_split);
    progress[3 * ring_rank_id_ + 2] = static_cast<float>(ring_round_ % ring_round_split);
    return ring_start(std::move(progress));
  }
  phase_start_ = clock_.steady_ns();
  const size_t n = grad_.size();
  std::vector<float> v(n + 3);
  for (size_t j = 0; j < n; ++j)
    v[j] = grad_[j] * static_cast<float>(batch_n_);
  v[n] = static_cast<float>(batch_n_);
  ring_vote_ = stop_requested_;
  v[n + 1] = ring_vote_ ? 1.0f : 0.0f;
  // The learning-rate factor is rank 0's (the others add 0): a schedule's change reaches
  // the members between different steps, and each applying its own would part the replicas.
  v[n + 2] = ring_rank_id_ == 0 ? schedule_lr_scale_ : 0.0f;
  step_bytes_ += 2 * n * sizeof(float) * (ring_size_ - 1) / std::max(1u, ring_size_);
  step_dense_ += 2 * n * sizeof(float) * (ring_size_ - 1) / std::max(1u, ring_size_);
  ring_start(std::move(v));
}

}  // namespace ashlar
