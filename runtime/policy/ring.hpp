// Decentralized training (ring all-reduce among the workers, runtime/collective/ring.hpp):
// the workers hold the model and update it together, in lockstep. The server shards only
// mirror it, for evaluation, snapshots and late readers: rank 0 pushes each step's update
// (the parameters before minus after), and the shards apply it as it is (lr 1, no
// momentum, no decay: see ring_mirror_optimizer). Pure code.
#pragma once

#include "runtime/optim/sgd.hpp"
#include "runtime/policy/sync_policy.hpp"

namespace ashlar {

class ring_policy final : public sync_policy {
public:
  const char* name() const override { return "ring"; }
  void on_join(worker_id w) override { live_.insert(w); }
  void on_leave(worker_id w) override { live_.erase(w); }
  push_decision on_push(worker_id, uint64_t, uint64_t) override {
    push_decision d;
    d.kind = push_decision::apply;
    return d;
  }
  bool round_ready() const override { return false; }
  void on_round_applied() override {}
  bool may_read(worker_id, uint64_t) const override { return true; }
  const std::set<worker_id>& live() const override { return live_; }
  bool lockstep() const override { return true; }

private:
  std::set<worker_id> live_;
};

/// The shards' optimizer under `policy`: for "ring" a mirror (an update is applied as it
/// is pushed), else `opt`.
inline sgd_config shard_optimizer(const std::string& policy, const sgd_config& opt) {
  if (policy != "ring")
    return opt;
  sgd_config mirror;
  mirror.lr = 1.0f;
  mirror.momentum = 0.0f;
  mirror.weight_decay = 0.0f;
  return mirror;
}

}  // namespace ashlar
