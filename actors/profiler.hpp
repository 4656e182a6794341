// The profiler actor: collects each worker's per-step timings and keeps smoothed
// speed estimates that the scheduler and the user's progress view read.
#pragma once

#include "actors/messages.hpp"

namespace ashlar::actors {

/// Spawns the profiler. `smoothing` is the weight of the newest step in the
/// exponential moving averages (default 0.1).
profiler_actor spawn_profiler(caf::actor_system& sys, double smoothing = 0.1);

}  // namespace ashlar::actors
