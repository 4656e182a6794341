// A shard's side of a checkpoint cut: the cut the job driver asked for at a version the
// shard has not made yet waits here until it does. Under a lockstep policy every shard
// writes the same version (an exact cut of the model); a shard already past it refuses,
// and the driver abandons the cut (cut_pacer::missed). Pure: the shard's sessions and the
// simulator's shards use it alike.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "runtime/core/error.hpp"

namespace ashlar {

class cut_schedule {
public:
  /// Cut `cut` asked for at `at_version` (0: now) of shard `shard_id`, which is at
  /// `version`: whether to write it now (false: once the shard makes that version, as
  /// on_version says). Errors: cut 0, or the shard past the cut's version. A new ask
  /// replaces one still due.
  expected<bool> ask(uint64_t cut, uint64_t at_version, uint64_t version, uint32_t shard_id);
  /// The shard made `version`: the cut due at it (or before), to be written now.
  std::optional<uint64_t> on_version(uint64_t version);
  std::optional<uint64_t> due() const;

private:
  std::optional<std::pair<uint64_t, uint64_t>> due_; // cut, at version
};

}  // namespace ashlar
