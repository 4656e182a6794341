// What a registering worker is told: its id, its part of the data and batch, how many
// steps it trains, and the job's settings that concern its steps. The scheduler asks
// these rules and routes the answer. Pure code: no CAF, no clocks, no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "runtime/policy/job_planner.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

struct train_config;

/// A resumed job's member as the checkpointed job left it: its batch share and data
/// position. A worker registering with that id starts from them.
struct resumed_worker {
  uint32_t batch = 0;
  wire::data_position position;
};

/// What the rules read besides the worker's id.
struct assignment_context {
  const train_config* job = nullptr;
  policy_traits traits;
  /// Training samples the workers split between them.
  uint64_t train_size = 0;
  /// The part of the job's epochs still to train (a resumed job: 1 - done / budget).
  double remaining = 1.0;
  /// Slowdown intervals of paced workers (the job's contention profile).
  const contention_profile* contention = nullptr;
};

/// Worker `id`'s assignment. The first train.workers ids own fixed data slots (so a run
/// is reproducible whatever order workers register in); later ids share them round robin
/// by `registered` (workers registered before this one).
/// - equal batches: the slot's part of the set, epochs x part / batch steps;
/// - any other allocation: the whole set until its first share (each worker draws its
///   own samples), and a lockstep job runs epochs x set / global batch rounds;
/// - a policy that is not lockstep: epochs x set / batch steps (the job ends when the
///   workers' samples together reach the budget);
/// - a resumed job: the remaining part of that.
/// Shards, data endpoints and the data key are the scheduler's to fill in.
wire::assignment make_assignment(const assignment_context& ctx, uint32_t id, uint32_t registered);

/// A resumed member's position applied to its assignment: its data part, cursor and
/// (unless batches are equal) its batch share. Returns why it cannot be applied (the
/// position does not fit the training set) instead, leaving `a` as it was.
[[nodiscard]] std::optional<std::string> apply_resumed(wire::assignment& a, const resumed_worker& r,
                                                       const assignment_context& ctx);

/// Steps a worker joining a running job trains: as many as the live member with the
/// most left still has (`assigned` steps per member, `done` steps per member so far).
uint64_t steps_left(const std::map<uint32_t, uint64_t>& assigned, const std::map<uint32_t, uint64_t>& done);

}  // namespace ashlar
