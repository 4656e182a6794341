#pragma once

#include <map>

#include "runtime/policy/sync_policy.hpp"

namespace ashlar {

/// Bulk-synchronous: every live worker's gradient is buffered; the round is applied
/// when each live worker has pushed once; a worker that has pushed may read only after
/// that round is applied. A second push in a round, or one computed from an older
/// version, is dropped. k-sync reuses all of this and only ends rounds earlier.
class bsp_policy : public sync_policy {
public:
  const char* name() const override { return "bsp"; }
  void on_join(worker_id w) override;
  void on_leave(worker_id w) override;
  push_decision on_push(worker_id w, uint64_t base_version, uint64_t version) override;
  bool round_ready() const override;
  void on_round_applied() override;
  bool may_read(worker_id w, uint64_t version) const override;
  const std::set<worker_id>& live() const override { return live_; }
  bool lockstep() const override { return true; }
  /// Its worker is no longer in the round (k-sync counts the workers that pushed).
  void on_push_cut_short(worker_id w) override { pushed_.erase(w); }
  std::vector<worker_id> holding_up() const override;

protected:
  std::set<worker_id> live_;
  std::set<worker_id> pushed_;                // pushed in the current round
  std::map<worker_id, uint64_t> waiting_for_; // version a pushed worker must wait for
};

}  // namespace ashlar
