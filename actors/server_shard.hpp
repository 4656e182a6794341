// The server-shard actor: owns one contiguous parameter range (a shard_core) and
// carries out what its sync policy decides.
#pragma once

#include <memory>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/server/shard_core.hpp"
#include "runtime/store/kv_store.hpp"
#include "runtime/store/store_lease.hpp"

namespace ashlar {
class pinned_dir;
}

namespace ashlar::actors {

/// Where a shard checkpoints its range (see runtime/store/checkpoint.hpp).
struct shard_persistence {
  /// The checkpoint directory held open, where the store was opened through it (first:
  /// it goes last, after the store has closed).
  std::shared_ptr<pinned_dir> pin;
  /// The store (e.g. RocksDB in DIR/shard-ID); null: no checkpoints.
  std::shared_ptr<kv_store> store;
  /// Checkpoint cuts kept. Default: 3.
  uint32_t keep = 3;
  /// The store's lease, renewed while the shard holds the store (store_lease.hpp).
  std::shared_ptr<store_lease> lease;
};

/// Who opens a shard's store, and that node's watch over stores other processes hold.
struct store_owner {
  /// For the store's lease: "node NAME, pid P on HOST". Empty: this process's pid and host.
  std::string holder;
  /// Where a shard is served again (resume) from a store another process holds: with a
  /// watch, the store is taken over once its lease has not changed for lease_stale_s
  /// (until then the open fails with busy, to be tried again); without one, it fails
  /// with busy at once.
  lease_watch* watch = nullptr;
  /// How long that lease must stand still. Default: lease_stale_s.
  double stale_s = lease_stale_s;
  /// The checkpoint directory held open (a submitted job's, beneath the node's work
  /// directory: pin_confined_dir): the store is opened through it, never through a link
  /// planted on the way since. Null: opened by its name.
  std::shared_ptr<pinned_dir> pinned;
};

/// Opens the checkpoint store of shard `shard_id` in `dir` (DIR/shard-ID, created), takes
/// its lease and, if `resume` (a shard served again mid-job), restores `core` from its
/// newest intact record (none stored: `core` stays as it is, with a log line); a store
/// whose holder no longer runs is taken over first (see store_owner). A job that starts
/// from a checkpoint restores its shards' common cut itself (restore_atom). Fails with
/// io_error naming the directory, busy while another process holds the store, or
/// shape_mismatch when the stored range is not the core's.
[[nodiscard]] expected<shard_persistence> open_shard_persistence(const std::string& dir, uint32_t keep,
                                                                 bool resume, shard_core& core,
                                                                 const store_owner& owner = {});

/// Spawns a shard around `core`. Reads held back by the policy are answered as soon as
/// the policy allows; a push that fails validation is answered with the error (the
/// shard itself keeps running). With a store in `persistence`, it writes the checkpoint
/// cuts the job driver asks for; a failed write is logged, shown in its status, and
/// training goes on.
shard_actor spawn_shard(caf::actor_system& sys, std::unique_ptr<shard_core> core,
                        shard_persistence persistence = {});

}  // namespace ashlar::actors
