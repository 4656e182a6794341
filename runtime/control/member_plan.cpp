#include "runtime/control/member_plan.hpp"

#include <algorithm>
#include <cmath>

namespace ashlar::control {

member_plan plan_member_changes(const std::map<uint32_t, ledger_entry>& members, const std::set<uint32_t>& lost,
                                const std::set<uint32_t>& newcomers, const std::map<uint32_t, uint64_t>& done_in,
                                uint64_t train_size, bool lockstep, bool ring, uint64_t lead_steps) {
  member_plan out;
  auto done = done_in;
  for (auto id : newcomers)
    done[id] = 0;
  auto done_of = [&](uint32_t id) {
    auto d = done.find(id);
    return d == done.end() ? uint64_t{0} : d->second;
  };
  std::map<uint32_t, member_part> live;
  for (const auto& [id, m] : members)
    if (!m.left && (m.admitted || newcomers.count(id) > 0)) {
      live[id] = m.part;
      if (newcomers.count(id) > 0)
        live[id].steps = 0;
    }
  if (live.empty())
    return out;
  out.live = live.size();
  // A ring's members take their steps together, and every plan gives them equal steps
  // left (a member admitted later counts its own steps from 0: steps left, not counts, are
  // on one scale). A member with one step more left than the others is at the same step
  // all the same: its report is on its way, or it is the step whose all-reduce a loss cut
  // short, which it counts as done when the ring is formed again.
  if (ring) {
    auto left_of = [&](uint32_t id, const member_part& m) { return m.steps > done_of(id) ? m.steps - done_of(id) : 0; };
    uint64_t fewest = UINT64_MAX;
    for (const auto& [id, m] : live)
      if (newcomers.count(id) == 0 && done.count(id) > 0)
        fewest = std::min(fewest, left_of(id, m));
    for (const auto& [id, m] : live)
      if (newcomers.count(id) == 0 && done.count(id) > 0 && left_of(id, m) == fewest + 1)
        done[id] = m.steps - fewest;
  }
  uint64_t owed = 0;
  for (auto id : lost) {
    auto m = members.find(id);
    if (m == members.end() || !m->second.admitted) // lost before its admission: owed nothing
      continue;
    auto left = hand_over_left(m->second.part, m->second.steps_left_at, done_of(id), {}, train_size, false);
    if (left.finished)
      continue;
    owed += static_cast<uint64_t>(std::ceil(samples_left(m->second.part, left.done_steps)));
    out.lost_steps[id] = left.done_steps;
  }
  out.handed_samples = lockstep ? owed : 0;
  // Steps members lost earlier left when nobody was live: the newcomers take them up.
  if (!newcomers.empty())
    for (const auto& [id, m] : members) {
      const uint64_t d = std::max(m.steps_left_at, done_of(id)); // what it said, or the shards did
      if (m.left && m.failed && m.admitted && lost.count(id) == 0 && m.part.steps > d) {
        owed += static_cast<uint64_t>(std::ceil(samples_left(m.part, d)));
        out.lost_steps[id] = d;
        ++out.taken_up;
      }
    }
  if (owed == 0 && newcomers.empty()) { // members that finished their steps: nothing to move
    out.live = 0;
    return out;
  }
  if (lockstep) {
    auto h = hand_over_lockstep(live, done, owed, train_size, ring, lead_steps);
    for (auto id : newcomers) {
      auto d = h.parts.find(id);
      out.newcomer_steps[id] = d == h.parts.end() ? 0 : d->second.steps;
      if (d == h.parts.end())
        continue;
      const auto& mine = live.at(id);
      if (d->second.data_begin == mine.data_begin && d->second.data_count == mine.data_count)
        h.parts.erase(d);
      else
        d->second.steps = 0;
    }
    out.directives = std::move(h.parts);
    return out;
  }
  // Workers at their own pace train until the job's sample budget is reached: a newcomer
  // trains as long as the live member with the most steps left, or what lost ones left.
  std::map<uint32_t, uint64_t> assigned;
  for (const auto& [id, m] : live)
    if (newcomers.count(id) == 0)
      assigned[id] = m.steps;
  uint64_t most = steps_left(assigned, done);
  if (assigned.empty())
    for (const auto& [id, m] : members)
      if (m.left && m.failed && m.part.steps > done_of(id))
        most = std::max(most, m.part.steps - done_of(id));
  for (auto id : newcomers)
    out.newcomer_steps[id] = most;
  out.directives = hand_over_joined(live, train_size).parts;
  return out;
}

}  // namespace ashlar::control
