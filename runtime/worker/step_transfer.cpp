// The step machine's transfer core, shared by every mode: a step's pulls (dense, chunked,
// delta), its computation and pacing, its pushes (chunked, sparse) and acknowledgements,
// and the report of the finished step (see step_machine.cpp for the other parts).
#include "runtime/worker/step_machine.hpp"

#include <algorithm>
#include <limits>

#include "runtime/pacing/contention.hpp"

#include <spdlog/spdlog.h>

namespace ashlar {

namespace {

// Most step budgets of host time a paced worker owes itself (see pace_debt_ns_).
constexpr uint64_t pace_carry_steps = 4;

}  // namespace

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
  for (; !next_parts_.empty() && next_parts_.front().from <= step_; next_parts_.pop_front()) {
    job_.batch_size = next_parts_.front().batch;
    if (auto err = take_data_part(next_parts_.front().begin, next_parts_.front().count))
      return fail(describe(err));
  }
  in_step_ = true;
  if (mode_ == step_mode::ring && step_ > 0) {
    drop_reads_ahead();
    compute_step(); // the model is local: compute, then all-reduce
  } else if (mode_ == step_mode::ring) {
    ring_io_ = ring_io::first_pull; // the first step reads the model from the shards
    pull_all();
  } else if (local_done_ > 0 || commit_inflight_ || (mode_ == step_mode::local_steps && model_local_)) {
    drop_reads_ahead(); // (a read sent ahead is older than the commit this step adds to)
    compute_step();     // a commit is open, or one is in flight: compute on the local model
  } else {
    pull_all();
  }
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
    for (size_t j = 0; j < n_params_; ++j)
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
  const size_t n = job_.shards.size();
  pending_ = n;
  transfers_.assign(n, transfer{});
  pulled_views_.clear(); // (an abandoned pull's)
  ahead_.resize(n);
  for (size_t i = 0; i < n; ++i)
    transfers_[i].total = job_.shards[i].size();
  // A read sent ahead behind the last push is this pull's (an overlapped commit's pull
  // follows its own push: none applies to it); a reply that is here already is taken
  // once every shard's read is under way.
  std::vector<size_t> here;
  for (size_t i = 0; i < n; ++i) {
    auto& a = ahead_[i];
    if (a.gen != gen_ || commit_inflight_)
      a.state = ahead_read::none;
    if (a.state == ahead_read::arrived)
      here.push_back(i);
    else if (a.state == ahead_read::sent)
      a.state = ahead_read::awaited;
    else
      request_pull_chunk(i);
  }
  for (size_t i : here) {
    if (stopped_ || suspended_)
      return;
    wire::pull_reply r = std::move(ahead_[i].reply);
    ahead_[i] = ahead_read{};
    on_pull_reply(i, gen_, r);
  }
}

// Reads sent ahead are of no use once a step goes on without pulling, or a new push
// begins: their replies are dropped when they come.
void step_machine::drop_reads_ahead() {
  for (auto& a : ahead_)
    a = ahead_read{};
}

// A step's read may go ahead behind its push where the next step begins with a plain
// dense read of every shard: every step mode (each step pulls), no delta reads, a next
// step to come.
bool step_machine::read_ahead_due() const {
  return mode_ == step_mode::every_step && !commit_inflight_ && !mirror_push_ && ring_io_ == ring_io::none
         && pull_ratio_ == 0 && !stop_requested_ && step_ + 1 < job_.steps;
}

// The next step's read of shard i, right behind the push that ends this step's.
void step_machine::read_ahead(size_t i) {
  ahead_.resize(job_.shards.size());
  ahead_[i] = ahead_read{ahead_read::sent, gen_, {}};
  wire::pull_request req{job_.worker_id, job_.shards[i].shard_id, false, 0, job_.chunk_floats, 0};
  emit(step::send_pull{i, gen_, req, true});
}

void step_machine::on_read_ahead(size_t i, uint64_t gen, const wire::pull_reply& r) {
  if (!current(gen) || i >= ahead_.size() || ahead_[i].gen != gen)
    return;
  auto& a = ahead_[i];
  if (a.state == ahead_read::sent) {
    a.state = ahead_read::arrived;
    a.reply = r;
  } else if (a.state == ahead_read::awaited) {
    a = ahead_read{};
    on_pull_reply(i, gen, r);
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
  if (!commit_inflight_ && defer_params()) {
    pulled_views_.emplace_back(range.begin + r.offset, r.params); // copied when the step computes
  } else {
    if (!commit_inflight_)
      ensure_params();
    auto& target = commit_inflight_ ? pulled_ : params_;
    std::copy(r.params.begin(), r.params.end(), target.begin() + static_cast<std::ptrdiff_t>(range.begin + r.offset));
  }
  step_bytes_ += r.params.size() * sizeof(float);
  step_dense_ += r.params.size() * sizeof(float);
  if (r.offset == 0)
    t.view_seq = r.view_seq;
  if (t.view_seq != 0) {
    // The shard keeps a view of this read: the mirror holds what it holds.
    if (mirror_.size() != n_params_)
      mirror_.resize(n_params_);
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
  if (mirror_.size() != n_params_)
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
  if (!commit_inflight_)
    ensure_params();
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

// Parameters are given back between steps where the step's buffers are (a node with more
// workers than cores) and each step pulls the whole model (every step mode, dense reads,
// the model on this side).
bool step_machine::defer_params() const {
  return release_grad_ && !held_ && mode_ == step_mode::every_step && pull_ratio_ == 0 && !commit_inflight_
         && ring_io_ == ring_io::none && !mirror_push_;
}

void step_machine::give_back_between_steps(bool yes) {
  release_grad_ = yes;
  if (!yes || in_step_ || step_ > 0)
    return;
  std::vector<float>().swap(grad_); // taken, zeroed, when the first step computes
  if (defer_params())
    std::vector<float>().swap(params_);
}

void step_machine::ensure_params() {
  if (params_.size() != n_params_)
    params_.assign(n_params_, 0.0f);
}

// Computes the step's gradient (the actor runs the backend and answers on_computed).
void step_machine::compute_step() {
  ensure_params();
  for (const auto& [at, v] : pulled_views_) // the pull's replies, kept as they came
    std::copy(v.begin(), v.end(), params_.begin() + static_cast<std::ptrdiff_t>(at));
  pulled_views_.clear();
  compute_t0_ = clock_.steady_ns();
  compute_offset_ns_ = compute_t0_ > step_begin_ ? compute_t0_ - step_begin_ : 0;
  auto batch = cursor_->next(job_.batch_size);
  batch_n_ = static_cast<uint32_t>(batch.n);
  if (grad_.size() != n_params_) // given back after the last step's pushes
    grad_.assign(n_params_, 0.0f);
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
    commit_.resize(n_params_);
    pulled_.resize(n_params_);
    local_velocity_.assign(n_params_, 0.0f);
  }
}

// A paced worker waits out the rest of its budget (batch x pace, slowed by contention)
// with a delayed message, never blocking a thread.
void step_machine::on_computed(const expected<batch_stats>& stats) {
  if (release_grad_) // the batch is computed: its buffer until the next step
    cursor_->release();
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
    for (const auto& [name, value] : stats->metrics)
      metrics_.push_back({name, value});
    // A backend may take a batch of its own (a script's DataLoader): its size is what the
    // step counts, weighs its push by and is paced for.
    if (stats->own_batch)
      batch_n_ = static_cast<uint32_t>(stats->n);
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

void step_machine::send_pushes() {
  drop_reads_ahead();
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
  if (auto buf = push_buffers_ ? push_buffers_(len) : nullptr) {
    std::copy(from, from + static_cast<std::ptrdiff_t>(len), buf.get());
    msg.grad = wire::shared_tensor{std::shared_ptr<const float>(std::move(buf)), len};
  } else {
    msg.grad.assign(from, from + static_cast<std::ptrdiff_t>(len));
  }
  t.next += len;
  const bool ahead = t.next == t.total && read_ahead_due();
  msg.read_follows = ahead;
  emit(step::send_push{i, gen_, len, std::move(msg)});
  if (ahead)
    read_ahead(i);
  gradient_sent();
}

// Every push of the step holds its copy of the gradient: its buffer is given back until
// the next step computes (release_gradient_between_steps).
void step_machine::gradient_sent() {
  if (!release_grad_ || mode_ == step_mode::ring || commit_inflight_ || mirror_push_ || held_)
    return;
  for (const auto& t : transfers_)
    if (t.next < t.total)
      return;
  std::vector<float>().swap(grad_);
  if (defer_params()) // and the parameters until the next step's pull has come
    std::vector<float>().swap(params_);
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
    const bool ahead = read_ahead_due();
    msg.read_follows = ahead;
    emit(step::send_push{i, gen_, transfers_[i].total, std::move(msg)});
    if (ahead)
      read_ahead(i);
  }
  gradient_sent();
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
  // A shard answers a push after the read behind it: the time that read was held (the
  // round's wait) passed in this step, and is its wait, not its push's (nor the next
  // step's, which takes the read as it is: pacing counts each step's host time once).
  uint64_t held = 0;
  for (auto& a : ahead_)
    if (a.gen == gen_ && a.state == ahead_read::arrived) {
      held = std::max(held, a.reply.wait_ns);
      a.reply.wait_ns = 0;
    }
  const uint64_t push_ns = since(phase_start_);
  held = std::min(held, push_ns);
  wait_ns_ += held;
  report_step(push_ns - held);
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
  rep.steps_target = job_.steps;
  rep.directives = directives_;
  rep.start_ns = step_begin_wall_;
  rep.compute_offset_ns = compute_offset_ns_;
  rep.staleness = step_staleness_;
  rep.batch = job_.batch_size;
  rep.position = {job_.data_begin, job_.data_count, cursor_->seed(), cursor_->epoch(), cursor_->pos()};
  rep.metrics = std::move(metrics_);
  metrics_.clear();
  last_begin_ = step_begin_;
  last_parts_ns_ = rep.compute_ns + rep.pull_ns + rep.wait_ns + rep.push_ns - given_ns_;
  given_ns_ = 0;
  last_follows_ = true;
  pull_ns_ = wait_ns_ = step_bytes_ = step_dense_ = step_staleness_ = 0;
  ++step_;
  emit(step::report{rep});
}

}  // namespace ashlar
