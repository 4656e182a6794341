// What a registering worker is told: its id, its part of the data and batch, how many
// steps it trains, and the job's settings that concern its steps. The scheduler asks
// these rules and routes the answer. Pure code: no CAF, no clocks, no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

/// A live member as the scheduler knows it: its batch share, its part of the training
/// set, and the steps it was told to train. A directive moves a part from a later step,
/// so its steps before trained earlier parts: `earlier` holds (end, samples) in order, the
/// steps before each end (and from the one before) training `samples` each; its steps from
/// the last end on train its part.
struct member_part {
  uint32_t batch = 0;
  uint64_t data_begin = 0, data_count = 0;
  uint64_t steps = 0;
  std::vector<std::pair<uint64_t, double>> earlier;

  member_part(uint32_t b = 0, uint64_t begin = 0, uint64_t count = 0, uint64_t s = 0,
              std::vector<std::pair<uint64_t, double>> before = {})
      : batch(b), data_begin(begin), data_count(count), steps(s), earlier(std::move(before)) {}
};

/// How the training set is covered again after a membership change: every live member's
/// new part (in id order, in proportion to its batch share, so one pass of the job is one
/// pass over the set) and, under a lockstep policy, its new step count.
struct handover {
  std::map<uint32_t, batch_directive> parts; // only members whose part or steps change
  uint64_t reassigned_samples = 0;           // lockstep: the lost member's untrained samples
  uint64_t extra_rounds = 0;                 // lockstep: rounds every live member adds
};

/// A member was lost having trained `done_steps` of `lost.steps`: its untrained samples
/// go to the `live` members. Their parts are re-split over the whole set (from their
/// next step); a lockstep job's members each run ceil(untrained / sum of live batches)
/// more rounds, so the job's epochs still cover the set. (Members of a policy that is
/// not lockstep train until the job's sample budget is reached: only their parts move,
/// and no samples count as reassigned.)
handover hand_over_lost(const member_part& lost, uint64_t done_steps, const std::map<uint32_t, member_part>& live,
                        uint64_t train_size, bool lockstep);

/// The samples one step of a member trains, on average over a pass of its part: its batch
/// share, or less when its part is not a whole number of batches (the last batch of each
/// pass is smaller): data_count / ceil(data_count / batch). With no part: the batch.
double step_samples(const member_part& m);

/// The samples a member's steps [a, b) train: on its earlier parts, then step_samples of
/// its part.
double samples_between(const member_part& m, uint64_t a, uint64_t b);

/// The samples a member with `done` steps taken still trains: samples_between(done, steps).
double samples_left(const member_part& m, uint64_t done);

/// The member as the ledger keeps it once `d` is sent: its part (if moved) and batch share
/// from d.from_step (what its steps before train kept in `earlier`), its steps (if given).
member_part after_directive(const member_part& m, const batch_directive& d);

/// Steps a lockstep member takes on its old part while a directive of a membership change
/// reaches it: the one in flight as the plan is made (the profiler counts it when it ends),
/// the one a round that the losses released may have begun (the plan waits for the shards'
/// acknowledgements), and one for the messages. The directive moves its part from that step
/// on; one that still comes later is corrected for (steps_after_directive), to the nearest
/// step.
constexpr uint64_t directive_lead = 3;

/// The steps a lockstep member trains in all under a directive whose new part starts at
/// step `from` (its from_step), received after it had already taken `taken` steps: the
/// steps past `from` trained its old part (`old_step` samples each, step_samples of it),
/// where the plan counted steps of `new_step` samples. The member trains the plan's
/// samples from `from` on, less what those steps trained: `taken` plus the rest in steps
/// of `new_step`, rounded up (never short of the plan). A directive without steps (0), or one that came in
/// time, is taken as it is.
uint64_t steps_after_directive(uint64_t steps, uint64_t from, uint64_t taken, double old_step, double new_step);

/// Lockstep members lost: what they left untrained (`lost_owed` samples, counted once by
/// the caller from each lost member's steps left times step_samples of its part) and what
/// the `live` members still owe (each one's steps left, from `done`, times step_samples)
/// are trained once over the live members' steps. The set is re-split over the live members
/// as in hand_over_lost; each member trains `directive_lead` more steps on its old part
/// (fewer if it has fewer left; none in a ring, or if `done` has no count of it), and its
/// new part from there (the
/// directive's from_step), a round being what the members' steps train on their new
/// parts. The owed samples are conserved whatever the order and number of losses: every
/// live member gets floor(owed / a round) more steps and, with `even_rounds` (a ring, whose
/// members must take the same steps), one more each while any remain; otherwise one more
/// only for the first members in id order until the remainder is covered, so a job never
/// trains more than one batch past what it owes.
handover hand_over_lockstep(const std::map<uint32_t, member_part>& live, const std::map<uint32_t, uint64_t>& done,
                            uint64_t lost_owed, uint64_t train_size, bool even_rounds,
                            uint64_t lead_steps = directive_lead);

/// A member that left (lost, removed, or done): how many of its `left.steps` it trained,
/// and what the live members take over. The steps done are what it said when it left
/// (`reported`; 0 from a member lost without a word) or the profiler's count (`counted`,
/// which may be a step or two behind a worker that finished its share just now),
/// whichever is more. A member that trained all its steps hands nothing over
/// (`finished`); otherwise `h` is hand_over_lost's from the steps done.
struct left_member {
  bool finished = false;
  uint64_t done_steps = 0;
  handover h;
};
left_member hand_over_left(const member_part& left, uint64_t reported, uint64_t counted,
                           const std::map<uint32_t, member_part>& live, uint64_t train_size, bool lockstep);

/// A member joined a running job: the set is re-split over `live` (the newcomer included)
/// so it takes a part of its own instead of doubling another's. Step counts stay.
handover hand_over_joined(const std::map<uint32_t, member_part>& live, uint64_t train_size);

/// A member joins a running lockstep job (every live member trains the same rounds): the
/// samples still owed are trained once over the live batches, the newcomer's included,
/// instead of the newcomer adding rounds of its own to the job. Owed: each live member's
/// steps left (`steps` - `done`) times its batch, plus the same for `lost` members whose
/// steps nobody took over (every worker was lost at once). They are spread as
/// hand_over_lockstep spreads them (with `even_rounds`, a ring's, every live member trains
/// ceil(owed / sum of live batches) more steps; without, at most one batch past what is
/// owed, so that joins one after another do not each add a round); the directives are in
/// `h` (the set re-split as in hand_over_joined) and the newcomer (`live[newcomer]`) trains
/// `rounds` steps.
struct lockstep_join {
  handover h;
  uint64_t rounds = 0;
  uint64_t owed_samples = 0;
};
lockstep_join hand_over_joined_lockstep(const std::map<uint32_t, member_part>& live,
                                        const std::map<uint32_t, member_part>& lost,
                                        const std::map<uint32_t, uint64_t>& done, uint32_t newcomer,
                                        uint64_t train_size, bool even_rounds = true);

}  // namespace ashlar
