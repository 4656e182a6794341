// When a wait in a job is a stall, and whose: a shard holds the reads of workers that are
// waiting for others (a BSP round some have not pushed to, an SSP bound the slowest keeps
// the others behind); the policy names the workers the wait is for (holding_up). A wait
// that lasts past its deadline, derived from the speeds measured (`factor` times the
// slowest live worker's smoothed step, within [floor, ceiling]), removes those workers,
// never the ones waiting: a worker hung in its step, its process frozen or its script stuck,
// gives up its share to the others instead of taking them down with it.
//
// The ceiling stays under a waiting worker's own request timeout (120 s), so that the
// waiting worker never gives up first; the floor leaves room for what a step may do beyond
// its usual work (a script's evaluation pass on one rank, a first step's warm-up). Pure:
// the scheduler (actors/scheduler.cpp) feeds it each tick's figures and removes whom it
// names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ashlar::control {

struct stall_rule {
  double factor = 20;    ///< the deadline in the slowest live worker's step times
  double floor_s = 60;   ///< the shortest deadline, s
  double ceiling_s = 100; ///< the longest, s (under a worker's 120 s request timeout)
};

/// What one tick sees: how long the oldest held read has waited (0: none held), whom the
/// wait is for, and the smoothed step seconds of the live workers measured so far.
struct stall_view {
  double held_seconds = 0;
  std::vector<uint32_t> holding_up;
  std::vector<double> step_seconds;
};

struct stall_verdict {
  std::vector<uint32_t> remove; ///< the workers the wait is for, once it is past its deadline
  double deadline_s = 0;        ///< the deadline this view had
  std::string why;              ///< for the log and each removed worker's reason
};

/// The deadline for a job whose slowest live worker steps in `slowest_step_s`.
double stall_deadline(double slowest_step_s, const stall_rule& rule = {});

/// The workers to remove for this view (none while the wait is within its deadline).
stall_verdict judge_stall(const stall_view& view, const stall_rule& rule = {});

}  // namespace ashlar::control
