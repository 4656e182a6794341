#include "runtime/server/shard_core.hpp"

#include "runtime/os/memory.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

namespace ashlar {

namespace {

// `v` as a version's buffer, where it lies (every pull copies from it: huge pages).
std::shared_ptr<float> adopt(std::vector<float> v) {
  auto owner = std::make_shared<std::vector<float>>(std::move(v));
  prefer_huge_pages(owner->data(), owner->size() * sizeof(float));
  return {owner, owner->data()};
}

} // namespace

shard_core::shard_core(shard_range range, std::vector<float> params, sgd_config opt,
                       std::unique_ptr<sync_policy> policy)
  : range_(range),
    velocity_(params.size(), 0.0f),
    second_(keeps_second_moment(opt) ? params.size() : 0, 0.0f),
    opt_(opt),
    policy_(std::move(policy)),
    acc_(params.size(), 0.0f) {
  params_ = adopt(std::move(params));
}

std::shared_ptr<float> shard_core::stored_buffer() const {
  return storage_ ? storage_(range_.size()) : nullptr;
}

std::shared_ptr<float> shard_core::new_buffer() const {
  if (auto b = stored_buffer())
    return b;
  return adopt(std::vector<float>(range_.size()));
}

void shard_core::use_storage(buffer_source source, std::function<void()> reclaim) {
  storage_ = std::move(source);
  reclaim_ = std::move(reclaim);
  spare_.reset();
  auto moved = stored_buffer();
  if (!moved)
    return; // the heap it is
  std::copy(params_.get(), params_.get() + range_.size(), moved.get());
  params_ = std::move(moved);
}

caf::error shard_core::restore(uint64_t version, std::vector<float> params, std::vector<float> velocity,
                               std::vector<float> average, uint64_t average_samples) {
  if (params.size() != range_.size() || (!velocity.empty() && velocity.size() != range_.size())
      || (!average.empty() && average.size() != range_.size()))
    return make_error(errc::shape_mismatch, "shard " + std::to_string(range_.shard_id) + ": a checkpoint of "
                                              + std::to_string(params.size()) + " parameters, "
                                              + std::to_string(velocity.size()) + " velocities and "
                                              + std::to_string(average.size()) + " averages for a range of "
                                              + std::to_string(range_.size()));
  spare_.reset();
  if (auto stored = stored_buffer()) {
    std::copy(params.begin(), params.end(), stored.get());
    params_ = std::move(stored);
  } else {
    params_ = adopt(std::move(params)); // where they lie
  }
  if (velocity.empty() || keeps_second_moment(opt_)) // (Adam's moments and count start over together)
    velocity.assign(range_.size(), 0.0f);
  velocity_ = std::move(velocity);
  if (keeps_second_moment(opt_))
    second_.assign(range_.size(), 0.0f);
  steps_ = 0;
  version_ = version;
  if (keeps_average() && !average.empty()) { // the checkpointed average goes on
    average_ = std::move(average);
    average_seen_ = average_samples;
  } else if (keeps_average()) { // none checkpointed: it starts again from the parameters
    average_ = this->params().to_vector();
    average_seen_ = 0;
  }
  return caf::none;
}

void shard_core::keep_average(double half_life_samples) {
  average_half_life_ = half_life_samples > 0 && std::isfinite(half_life_samples) ? half_life_samples : 0;
  average_seen_ = 0;
  if (keeps_average())
    average_ = params().to_vector();
  else
    average_ = {};
}

wire::shared_tensor shard_core::average_copy() const {
  if (!keeps_average())
    return shared_params();
  return wire::shared_tensor{std::make_shared<const std::vector<float>>(average_), 0, average_.size()};
}

void shard_core::note_update(uint64_t samples) {
  counters_.samples += samples;
  if (!keeps_average() || samples == 0)
    return;
  average_seen_ += samples;
  const double h = std::min(average_half_life_, 0.1 * static_cast<double>(average_seen_));
  const float step = static_cast<float>(1.0 - std::exp2(-static_cast<double>(samples) / h));
  const float* p = params_.get();
  for (size_t i = 0; i < average_.size(); ++i)
    average_[i] += step * (p[i] - average_[i]);
}

float* shard_core::writable_params() {
  // Only this class hands out references, so a count of 1 stays 1. The fence after
  // reading the counts orders the last reader's accesses before our writes.
  bool shared = params_.use_count() > 1;
  if (shared && reclaim_) {
    reclaim_();
    shared = params_.use_count() > 1;
  }
  if (shared && (!spare_ || spare_.use_count() > 1))
    spare_ = new_buffer();
  std::atomic_thread_fence(std::memory_order_acquire);
  if (shared) {
    std::copy(params_.get(), params_.get() + range_.size(), spare_.get());
    std::swap(params_, spare_);
  }
  return params_.get();
}

void shard_core::join(worker_id w) {
  policy_->on_join(w);
}

bool shard_core::leave(worker_id w) {
  bool bumped = end_push(w); // a push cut short: what arrived of it counts
  policy_->on_leave(w);
  return maybe_apply_round() || bumped;
}

expected<push_outcome> shard_core::push(worker_id w, uint64_t base_version, uint32_t batch,
                                        const float* grad, size_t n) {
  auto begun = begin_push(w, base_version, batch, n);
  if (!begun)
    return begun.error();
  return push_piece(w, 0, grad, n);
}

expected<push_outcome> shard_core::begin_push(worker_id w, uint64_t base_version, uint32_t batch, size_t n) {
  const std::string where = "shard " + std::to_string(range_.shard_id);
  if (n != range_.size())
    return make_error(errc::shape_mismatch, where + " received a gradient of " + std::to_string(n)
                                              + " floats from worker " + std::to_string(w)
                                              + ", its range holds " + std::to_string(range_.size()));
  if (policy_->live().count(w) == 0)
    return make_error(errc::invalid_state,
                      where + " received a push from worker " + std::to_string(w)
                        + ", which is not a live member");
  if (base_version > version_)
    return make_error(errc::invalid_state, where + " is at version " + std::to_string(version_)
                                             + ", worker " + std::to_string(w)
                                             + " pushed from future version "
                                             + std::to_string(base_version));
  if (batch == 0)
    return make_error(errc::invalid_argument, where + " received a push with batch size 0");
  if (inflight_.count(w) > 0)
    end_push(w);
  ++counters_.pushes;
  auto d = policy_->on_push(w, base_version, version_);
  auto& f = inflight_[w];
  f.decision = d;
  f.slot.batch = batch;
  if (d.kind != push_decision::drop) {
    counters_.staleness_sum += d.staleness;
    counters_.staleness_max = std::max(counters_.staleness_max, d.staleness);
  }
  if (d.kind == push_decision::apply) {
    writable_params(); // copy now if a reader holds this version; pieces then write in place
    ++applying_;
    f.step = ++steps_;
  } else if (d.kind == push_decision::buffer) {
    if (f.slot.grad.empty() && !free_buffers_.empty()) {
      f.slot.grad = std::move(free_buffers_.back());
      free_buffers_.pop_back();
    }
    f.slot.grad.resize(n);
    ++buffering_;
  } else {
    ++counters_.dropped;
  }
  push_outcome out;
  out.kind = d.kind;
  out.staleness = d.staleness;
  out.version = version_;
  return out;
}

expected<push_outcome> shard_core::push_piece(worker_id w, uint64_t offset, const float* grad, size_t n) {
  auto it = inflight_.find(w);
  if (it == inflight_.end())
    return make_error(errc::invalid_state, "shard " + std::to_string(range_.shard_id)
                                             + " received a piece of a push from worker "
                                             + std::to_string(w) + " that did not begin one");
  auto& f = it->second;
  if (offset != f.received || offset + n > range_.size() || n == 0)
    return make_error(errc::shape_mismatch, "shard " + std::to_string(range_.shard_id) + " received ["
                                              + std::to_string(offset) + ", +" + std::to_string(n)
                                              + ") of a push from worker " + std::to_string(w)
                                              + ", expected the piece at " + std::to_string(f.received)
                                              + " of a range of " + std::to_string(range_.size()));
  if (f.decision.kind == push_decision::apply) // (a checkpoint may have taken the parameters since)
    apply_update(f.decision.lr_scale * lr_scale(), offset, grad, n, f.step);
  else if (f.decision.kind == push_decision::buffer)
    std::copy(grad, grad + n, f.slot.grad.begin() + static_cast<std::ptrdiff_t>(offset));
  f.received += n;
  push_outcome out;
  out.kind = f.decision.kind;
  out.staleness = f.decision.staleness;
  if (f.received == range_.size())
    out.version_bumped = end_push(w);
  out.version = version_;
  return out;
}

void shard_core::apply_update(float lr_scale, size_t offset, const float* grad, size_t n, uint64_t step) {
  optimizer_apply(opt_, lr_scale, writable_params() + offset, velocity_.data() + offset,
                  second_.empty() ? nullptr : second_.data() + offset, grad, n, step);
}

bool shard_core::end_push(worker_id w) {
  auto it = inflight_.find(w);
  if (it == inflight_.end())
    return false;
  auto f = std::move(it->second);
  inflight_.erase(it);
  switch (f.decision.kind) {
    case push_decision::apply:
      // Pieces already applied are in the parameters: they make a version even if the
      // push ended early (its worker left).
      --applying_;
      ++version_;
      ++counters_.applied;
      // A push cut short counts for the share of the range it reached.
      note_update(f.received == range_.size() ? f.slot.batch
                                              : f.slot.batch * f.received / std::max<uint64_t>(1, range_.size()));
      maybe_apply_round(); // a round may have waited for this apply
      return true;
    case push_decision::buffer:
      --buffering_;
      if (f.received == range_.size())
        round_.emplace(w, std::move(f.slot));
      else // its worker left halfway: the round goes on without it
        policy_->on_push_cut_short(w);
      return maybe_apply_round();
    case push_decision::drop:
      break;
  }
  return false;
}

bool shard_core::maybe_apply_round() {
  // A round waits for gradients still arriving in pieces, and for in-place applies (its
  // update must not mix with a half-applied push).
  if (round_.empty() || buffering_ > 0 || applying_ > 0 || !policy_->round_ready())
    return false;
  // Batch-weighted mean of the buffered mean gradients, summed in worker-id order so
  // the result is bit-identical from run to run whatever the arrival order.
  double total = 0;
  for (const auto& [w, p] : round_)
    total += p.batch;
  if (round_.size() == 1) {
    // One gradient (weight 1): the update reads it directly, without the sum's pass.
    auto& only = round_.begin()->second;
    apply_update(lr_scale(), 0, only.grad.data(), only.grad.size(), ++steps_);
    counters_.applied += 1;
    if (free_buffers_.size() < 8)
      free_buffers_.push_back(std::move(only.grad));
    round_.clear();
    ++version_;
    note_update(static_cast<uint64_t>(total));
    policy_->on_round_applied();
    return true;
  }
  bool first = true;
  for (const auto& [w, p] : round_) {
    const float weight = static_cast<float>(p.batch / total);
    const float* g = p.grad.data();
    if (first) // the first gradient sets the sum: no pass to zero it
      for (size_t i = 0; i < acc_.size(); ++i)
        acc_[i] = weight * g[i];
    else
      for (size_t i = 0; i < acc_.size(); ++i)
        acc_[i] += weight * g[i];
    first = false;
  }
  apply_update(lr_scale(), 0, acc_.data(), acc_.size(), ++steps_);
  counters_.applied += round_.size();
  for (auto& [w, p] : round_)
    if (free_buffers_.size() < 8) // enough for a round of the usual sizes, bounded
      free_buffers_.push_back(std::move(p.grad));
  round_.clear();
  ++version_;
  note_update(static_cast<uint64_t>(total));
  policy_->on_round_applied();
  return true;
}

}  // namespace ashlar
