// Decentralized training (ring all-reduce among the workers, runtime/collective/ring.hpp):
// the workers hold the model and update it together, in lockstep. The server shards only
// mirror it, for evaluation, snapshots and late readers: rank 0 pushes each step's update
// (the parameters before minus after), and the shards apply it as it is (lr 1, no
// momentum, no decay: see ring_mirror_optimizer). Pure code.
#pragma once

#include "runtime/optim/sgd.hpp"
#include "runtime/policy/job_planner.hpp"
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

/// Which ring the scheduler's live workers form, and when: the job's first at its start
/// (generation 1), then a new one (the next generation) whenever a member is lost, leaves
/// before its steps are done (removed on request: the others wait for the new ring) or a
/// worker joins. Once that happened, any member leaving forms one too: after a loss the
/// members may be a step apart, and one that finished the job's last step while the
/// others redo it must not be waited for. A job that never changed its ring ends as it
/// started, its members leaving together.
class ring_membership {
public:
  /// Training starts: the generation of the first ring.
  uint32_t start() { return ++generation_; }
  /// A member left (`failed`: lost; `early`: before its steps were done): the generation
  /// of the ring the others form now, or 0 for none.
  uint32_t on_leave(bool failed, bool early = false) {
    if (!failed && !early && !changed_)
      return 0;
    changed_ = true;
    return ++generation_;
  }
  /// A worker joined the running job: the generation of the ring it joins.
  uint32_t on_join() {
    changed_ = true;
    return ++generation_;
  }
  uint32_t generation() const { return generation_; }

private:
  uint32_t generation_ = 0;
  bool changed_ = false;
};

/// The shards' optimizer under `policy`: for a ring (policy_traits::ring) a mirror (an update is applied as it
/// is pushed), else `opt`.
inline sgd_config shard_optimizer(const std::string& policy, const sgd_config& opt) {
  if (!traits_of(policy).ring)
    return opt;
  sgd_config mirror;
  mirror.lr = 1.0f;
  mirror.momentum = 0.0f;
  mirror.weight_decay = 0.0f;
  return mirror;
}

}  // namespace ashlar
