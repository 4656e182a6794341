#pragma once

#include "runtime/policy/sync_policy.hpp"

namespace ashlar {

/// Asynchronous: every gradient is applied on arrival; reads never wait. With
/// staleness_aware_lr the learning rate is divided by (1 + staleness).
class asp_policy final : public sync_policy {
public:
  explicit asp_policy(policy_config cfg) : cfg_(cfg) {}
  const char* name() const override { return "asp"; }
  void on_join(worker_id w) override { live_.insert(w); }
  void on_leave(worker_id w) override { live_.erase(w); }
  push_decision on_push(worker_id w, uint64_t base_version, uint64_t version) override;
  bool round_ready() const override { return false; }
  void on_round_applied() override {}
  bool may_read(worker_id, uint64_t) const override { return true; }
  const std::set<worker_id>& live() const override { return live_; }

private:
  policy_config cfg_;
  std::set<worker_id> live_;
};

}  // namespace ashlar
