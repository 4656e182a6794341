#pragma once

#include "runtime/policy/bsp.hpp"

namespace ashlar {

/// The k of k-sync and k-async with `live` workers: k capped at them, 0 meaning half of
/// them rounded up; at least 1.
size_t effective_k(uint32_t k, size_t live);

/// k-sync SGD (Dutta et al., 2018): every worker computes from the current version; the
/// round is applied as soon as the first k of them have pushed, and the gradients that
/// arrive later for the old version are dropped. A worker that has pushed waits for the
/// round; everything but the end of a round is BSP's, and k = live workers is BSP.
class k_sync_policy final : public bsp_policy {
public:
  explicit k_sync_policy(policy_config cfg) : cfg_(cfg) {}
  const char* name() const override { return "ksync"; }
  bool round_ready() const override;

  /// The k in force: cfg.k, capped at the live workers; 0 means half of them, rounded up.
  size_t k() const;
  /// Changes cfg.k (adaptive k-sync).
  void set_k(uint32_t k) { cfg_.k = k; }

private:
  policy_config cfg_;
};

/// k-async SGD (Dutta et al., 2018): gradients are buffered whatever version they were
/// computed from, and applied together once k have arrived; none is dropped and nobody
/// waits to read.
class k_async_policy final : public sync_policy {
public:
  explicit k_async_policy(policy_config cfg) : cfg_(cfg) {}
  const char* name() const override { return "kasync"; }
  void on_join(worker_id w) override { live_.insert(w); }
  void on_leave(worker_id w) override { live_.erase(w); }
  push_decision on_push(worker_id w, uint64_t base_version, uint64_t version) override;
  bool round_ready() const override;
  void on_round_applied() override { buffered_ = 0; }
  void on_push_cut_short(worker_id) override {
    if (buffered_ > 0)
      --buffered_;
  }
  bool may_read(worker_id, uint64_t) const override { return true; }
  const std::set<worker_id>& live() const override { return live_; }

  size_t k() const;
  void set_k(uint32_t k) { cfg_.k = k; }

private:
  policy_config cfg_;
  std::set<worker_id> live_;
  size_t buffered_ = 0;
};

}  // namespace ashlar
