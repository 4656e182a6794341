// The profiler actor: collects each worker's per-step timings and keeps smoothed
// speed estimates that the scheduler and the user's progress view read.
#pragma once

#include <memory>

#include "actors/interfaces.hpp"

namespace ashlar {
class run_recorder;
}

namespace ashlar::actors {

/// Spawns the profiler. `smoothing` is the weight of the newest step in the
/// exponential moving averages (default 0.1). Every step goes to `recorder` too, when
/// given (the run's trace and metrics files). Each worker's compute speed is also
/// averaged over windows of `window` seconds and predicted one window ahead by a GRU, so
/// that `ashlar status` can show predicted against observed speed. Reports are taken from
/// the job's members only, each of at most `step_samples_max` samples (the training set's
/// size; 0: no bound), and membership changes from this process only.
profiler_actor spawn_profiler(caf::actor_system& sys, double smoothing = 0.1,
                              std::shared_ptr<run_recorder> recorder = nullptr, double window = 0.25,
                              uint64_t step_samples_max = 0);

}  // namespace ashlar::actors
