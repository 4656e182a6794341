// The step machine's ring mode: each step's gradient all-reduced over the ring of workers,
// the ring's sync rounds when it is formed again, and rank 0's pushes to the shards'
// mirror.
#include "runtime/worker/step_machine.hpp"

#include <algorithm>

#include "runtime/optim/sgd.hpp"

#include <spdlog/spdlog.h>

namespace ashlar {

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
  const size_t n = n_params_;
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
  if (job_.rule != update_rule::sgd) { // Adam's moments and count start over on every member alike
    velocity_.assign(n, 0.0f);
    second_.assign(n, 0.0f);
    ring_updates_ = 0;
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
  // The step whose all-reduce the loss cut short here, and not at the furthest member,
  // is done: its batch is in the model taken up. It is reported as this member's, with
  // its samples (the job's count and the handover's ledger would miss them otherwise),
  // and the next step starts as any does.
  const bool stepped_up = ring_step_up_ > 0;
  if (stepped_up) {
    spdlog::info("worker {}: the re-formed ring goes on from the model of its furthest member, {} step(s) ahead",
                 job_.worker_id, ring_step_up_);
    step_ += ring_step_up_ - 1; // report_step counts the step in flight
  }
  if (ring_rank_id_ == 0 && lost_.empty())
    return read_mirror(!stepped_up); // the lost rank 0 may have died halfway through a push
  if (ring_rank_id_ == 0)
    mirror_stale_ = true; // read once the shards are back
  if (stepped_up) {
    report_step(since(phase_start_));
    return end_step();
  }
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
  const size_t n = n_params_;
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
  opt.rule = job_.rule;
  opt.beta1 = job_.beta1;
  opt.beta2 = job_.beta2;
  opt.eps = job_.eps;
  if (keeps_second_moment(opt) && second_.size() != n)
    second_.assign(n, 0.0f);
  if (ring_rank_id_ == 0)
    before_ = params_;
  optimizer_apply(opt, lr_scale, params_.data(), velocity_.data(), second_.data(), grad_.data(), n, ++ring_updates_);
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
