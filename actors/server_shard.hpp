// The server-shard actor: owns one contiguous parameter range (a shard_core) and
// carries out what its sync policy decides.
#pragma once

#include <memory>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/server/shard_core.hpp"
#include "runtime/store/kv_store.hpp"

namespace ashlar::actors {

/// Where a shard checkpoints its range (see runtime/store/checkpoint.hpp).
struct shard_persistence {
  /// The store (e.g. RocksDB in DIR/shard-ID); null: no checkpoints.
  std::shared_ptr<kv_store> store;
  /// Checkpoint cuts kept. Default: 3.
  uint32_t keep = 3;
};

/// Opens the checkpoint store of shard `shard_id` in `dir` (DIR/shard-ID, created) and,
/// if `resume` (a shard served again mid-job), restores `core` from its newest intact
/// record (none stored: `core` stays as it is, with a log line). A job that starts from a
/// checkpoint restores its shards' common cut itself (restore_atom). Fails with io_error
/// naming the directory, or shape_mismatch when the stored range is not the core's.
[[nodiscard]] expected<shard_persistence> open_shard_persistence(const std::string& dir, uint32_t keep,
                                                                 bool resume, shard_core& core);

/// Spawns a shard around `core`. Reads held back by the policy are answered as soon as
/// the policy allows; a push that fails validation is answered with the error (the
/// shard itself keeps running). With a store in `persistence`, it writes the checkpoint
/// cuts the job driver asks for; a failed write is logged, shown in its status, and
/// training goes on.
shard_actor spawn_shard(caf::actor_system& sys, std::unique_ptr<shard_core> core,
                        shard_persistence persistence = {});

}  // namespace ashlar::actors
