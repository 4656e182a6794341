// One plan for a running job's membership changes: the members lost since the last plan
// and the newcomers waiting for their steps, together. Pure: the scheduler actor gathers
// the changes and the profiler's step counts, asks this, and sends what it returns; the
// simulator (tests/sim) asks the same function.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "runtime/policy/assignment.hpp"

namespace ashlar::control {

/// A member as the scheduler keeps it.
struct ledger_entry {
  member_part part;            ///< batch share, part of the set, steps assigned
  bool left = false;           ///< gone (finished, removed or lost)
  bool failed = false;         ///< lost or failed, rather than left on its own
  bool admitted = false;       ///< training: started with the job or admitted to it
  uint64_t steps_left_at = 0;  ///< the steps it said it trained when it left (0: it did not say)
};

struct member_plan {
  /// Directives for live members whose part or steps change (newcomers' steps are in
  /// `newcomer_steps`; a directive for one carries only its moved part, steps 0).
  std::map<uint32_t, batch_directive> directives;
  std::map<uint32_t, uint64_t> newcomer_steps;
  /// Lost members whose untrained steps were handed over, and their steps from now on
  /// (what they trained: counted once).
  std::map<uint32_t, uint64_t> lost_steps;
  /// Lockstep: the lost members' untrained samples handed to the live ones.
  uint64_t handed_samples = 0;
  /// Members lost earlier, when nobody was live, whose steps the newcomers take up.
  size_t taken_up = 0;
  /// Live workers the plan concerns (0: nothing to send: nobody live, or only members that
  /// had finished their steps left).
  size_t live = 0;
};

/// Plans `lost` (members that left since the last plan; those that had trained all their
/// steps, or were lost before they were admitted, hand nothing over) and `newcomers` (admitted now, their steps to be set) over
/// `members`, with `done` the steps each member trained as the profiler counts them.
/// Lockstep jobs keep the samples owed, once (hand_over_lockstep, with `lead_steps` on a
/// member's old part; `ring`: equal steps);
/// others re-split the set and give a newcomer as many steps as the live member with the
/// most left. With nobody live, lost members' steps wait for a newcomer.
member_plan plan_member_changes(const std::map<uint32_t, ledger_entry>& members, const std::set<uint32_t>& lost,
                                const std::set<uint32_t>& newcomers, const std::map<uint32_t, uint64_t>& done,
                                uint64_t train_size, bool lockstep, bool ring,
                                uint64_t lead_steps = directive_lead);

}  // namespace ashlar::control
