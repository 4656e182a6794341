#pragma once

#include <map>

#include "runtime/policy/sync_policy.hpp"

namespace ashlar {

/// Stale-synchronous parallel (Ho et al., 2013): every push is applied on arrival; a worker
/// whose clock (pushes so far) is more than `staleness_bound` ahead of the slowest live
/// worker may not read until that worker catches up. Bound 0 keeps workers in lockstep,
/// an unbounded one is ASP.
class ssp_policy : public sync_policy {
public:
  explicit ssp_policy(policy_config cfg) : cfg_(cfg) {}
  const char* name() const override { return "ssp"; }
  void on_join(worker_id w) override;
  void on_leave(worker_id w) override;
  push_decision on_push(worker_id w, uint64_t base_version, uint64_t version) override;
  bool round_ready() const override { return false; }
  void on_round_applied() override {}
  bool may_read(worker_id w, uint64_t version) const override;
  const std::set<worker_id>& live() const override { return live_; }

  /// Changes the bound at run time (ASHL's stages); reads held by the old one are
  /// re-checked by the shard. A bound set counts from then on (a stage's gap from the
  /// stage's start): every live worker's clock starts level with the slowest's, so a lead
  /// built up in one stage holds nobody back in the next.
  void set_staleness_bound(uint64_t s) override;
  uint64_t staleness_bound() const { return cfg_.staleness_bound; }

  /// Pushes `w` has made (its clock).
  uint64_t clock(worker_id w) const;
  std::vector<worker_id> holding_up() const override;

private:
  policy_config cfg_;
  std::set<worker_id> live_;
  std::map<worker_id, uint64_t> clock_;
};

}  // namespace ashlar
