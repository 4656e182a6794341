// The synchronization policy of a server shard: given pushes and membership, it says
// whether a gradient is applied now, buffered for a round, or dropped, and whether a
// worker may read now. Pure code: no CAF, no clocks, no I/O.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/config/policy_settings.hpp"
#include "runtime/core/error.hpp"

namespace ashlar {

using worker_id = uint32_t;

/// What a shard does with one incoming gradient.
struct push_decision {
  enum kind_t : uint8_t {
    /// Apply this gradient now, alone, scaled by lr_scale.
    apply,
    /// Keep it for the current round (see sync_policy::round_ready).
    buffer,
    /// Discard it (too late or too stale).
    drop,
  };
  kind_t kind = apply;
  /// Learning-rate multiplier for `apply`. Default: 1.
  float lr_scale = 1.0f;
  /// Versions applied since the gradient's base version.
  uint64_t staleness = 0;
};

class sync_policy {
public:
  virtual ~sync_policy();

  /// Registry name, e.g. "bsp".
  virtual const char* name() const = 0;

  /// A worker joined (it will push from now on).
  virtual void on_join(worker_id w) = 0;

  /// A worker left (finished, removed or failed): rounds stop waiting for it.
  virtual void on_leave(worker_id w) = 0;

  /// A gradient from `w`, computed at `base_version`, arrives while the shard is at `version`.
  virtual push_decision on_push(worker_id w, uint64_t base_version, uint64_t version) = 0;

  /// True when the buffered gradients form a complete round that must be applied now
  /// (as one batch-weighted average). The shard calls it after every push and leave.
  virtual bool round_ready() const = 0;

  /// The shard applied the buffered round; the policy starts a new one.
  virtual void on_round_applied() = 0;

  /// True if worker `w` may read the parameters at `version` now; otherwise the
  /// shard holds the read until this becomes true.
  virtual bool may_read(worker_id w, uint64_t version) const = 0;

  /// Workers the policy currently counts as live.
  virtual const std::set<worker_id>& live() const = 0;

  /// True if workers advance in rounds together (BSP, k-sync): each then runs its equal
  /// share of the steps. Otherwise workers run at their own pace and the job ends when
  /// their samples together reach the budget (epochs x training set). Default: false.
  virtual bool lockstep() const { return false; }

  /// Run-time retuning by the scheduler (adaptive policies): gradients per update, and
  /// whether late gradients are kept (async) or dropped. Takes effect at the next round
  /// boundary. Default: ignored.
  virtual void tune(uint32_t k, bool async) {
    (void) k;
    (void) async;
  }

  /// Run-time change of how many clocks a worker may run ahead of the slowest (bounded
  /// staleness policies; ASHL moves it between its stages): the bound counts from then
  /// on, every live worker level with the slowest. Default: ignored.
  virtual void set_staleness_bound(uint64_t s) { (void) s; }

  /// A push on_push buffered ended before all of it arrived (its worker left halfway): it
  /// is not in the round, and a policy that counted it stops counting it. Default: nothing.
  virtual void on_push_cut_short(worker_id w) { (void) w; }

  /// The live workers a held read waits for (BSP: those that have not pushed in a round
  /// others have; SSP: the slowest, at the lowest clock): when such a wait runs past its
  /// deadline, these are the ones removed, never the workers waiting. Default: none.
  virtual std::vector<worker_id> holding_up() const { return {}; }
};

/// Makes a policy by registry name ("bsp", "asp", "ssp", "ksync", "kasync", "adsp", "adaptive", "ashl"). Fails with unknown_name, listing the names.
[[nodiscard]] expected<std::unique_ptr<sync_policy>> make_policy(const std::string& name,
                                                                const policy_config& cfg);

/// The names make_policy accepts.
std::vector<std::string> policy_names();

}  // namespace ashlar
