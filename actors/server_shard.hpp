// The server-shard actor: owns one contiguous parameter range (a shard_core) and
// carries out what its sync policy decides.
#pragma once

#include <memory>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/server/shard_core.hpp"

namespace ashlar::actors {

/// Spawns a shard around `core`. Reads held back by the policy are answered as soon as
/// the policy allows; a push that fails validation is answered with the error (the
/// shard itself keeps running).
shard_actor spawn_shard(caf::actor_system& sys, std::unique_ptr<shard_core> core);

}  // namespace ashlar::actors
