#include "runtime/server/shard_core.hpp"

#include <algorithm>
#include <string>

namespace ashlar {

shard_core::shard_core(shard_range range, std::vector<float> params, sgd_config opt,
                       std::unique_ptr<sync_policy> policy)
  : range_(range),
    params_(std::move(params)),
    velocity_(params_.size(), 0.0f),
    opt_(opt),
    policy_(std::move(policy)),
    acc_(params_.size(), 0.0f) {
}

void shard_core::join(worker_id w) {
  policy_->on_join(w);
}

bool shard_core::leave(worker_id w) {
  policy_->on_leave(w);
  return maybe_apply_round();
}

expected<push_outcome> shard_core::push(worker_id w, uint64_t base_version, uint32_t batch,
                                        const float* grad, size_t n) {
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
  ++counters_.pushes;
  auto d = policy_->on_push(w, base_version, version_);
  push_outcome out;
  out.kind = d.kind;
  out.staleness = d.staleness;
  switch (d.kind) {
    case push_decision::apply:
      sgd_apply(opt_, d.lr_scale, params_.data(), velocity_.data(), grad, n);
      ++version_;
      ++counters_.applied;
      counters_.staleness_sum += d.staleness;
      counters_.staleness_max = std::max(counters_.staleness_max, d.staleness);
      out.version_bumped = true;
      break;
    case push_decision::buffer: {
      auto& slot = round_.emplace(w, pending{})->second;
      slot.batch = batch;
      slot.grad.assign(grad, grad + n);
      counters_.staleness_sum += d.staleness;
      counters_.staleness_max = std::max(counters_.staleness_max, d.staleness);
      out.version_bumped = maybe_apply_round();
      break;
    }
    case push_decision::drop:
      ++counters_.dropped;
      break;
  }
  out.version = version_;
  return out;
}

bool shard_core::maybe_apply_round() {
  if (round_.empty() || !policy_->round_ready())
    return false;
  // Batch-weighted mean of the buffered mean gradients, summed in worker-id order so
  // the result is bit-identical from run to run whatever the arrival order.
  double total = 0;
  for (const auto& [w, p] : round_)
    total += p.batch;
  std::fill(acc_.begin(), acc_.end(), 0.0f);
  for (const auto& [w, p] : round_) {
    const float weight = static_cast<float>(p.batch / total);
    const float* g = p.grad.data();
    for (size_t i = 0; i < acc_.size(); ++i)
      acc_[i] += weight * g[i];
  }
  sgd_apply(opt_, 1.0f, params_.data(), velocity_.data(), acc_.data(), acc_.size());
  counters_.applied += round_.size();
  round_.clear();
  ++version_;
  policy_->on_round_applied();
  return true;
}

}  // namespace ashlar
