// Fitting a benchmark's pacing to the machine it runs on. A heterogeneity profile paces
// each worker to (1000 / sample_ms) x its speed samples/s; on one machine the workers
// share its cores, so a profile that asks more than the machine can compute measures
// contention for the cores, not the policies. The rule: a profile may ask at most `share`
// of the machine's measured throughput, in all and of one core for its fastest worker;
// beyond that every worker is slowed by the same factor (the speeds' ratios stay).
// Pure code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/pacing/contention.hpp"

namespace ashlar {

/// What the machine trained, unpaced, with every core busy.
struct machine_capacity {
  double samples_per_second = 0; // all workers together
  uint32_t cores = 1;            // the cores they shared
};

struct pacing_fit {
  double sample_ms = 0; // ms per sample at speed 1, at least the one asked for
  double slowdown = 1;  // sample_ms / the one asked for
  std::string why;      // empty when the pacing stands as asked
};

/// The pacing of a profile with `speeds` at `sample_ms` on `machine`: unchanged when it
/// asks at most `share` of the machine's throughput in all and `share` of one core's for its
/// fastest worker, else slowed until it asks exactly that. share <= 0, an unmeasured
/// machine (0 samples/s) or no speeds: unchanged.
pacing_fit fit_pacing(double sample_ms, const std::vector<double>& speeds, const machine_capacity& machine,
                      double share);

/// A contention profile on the timeline of a run `slowdown` times slower: every interval
/// starts and ends that many times later, so it covers the same part of the run.
contention_profile stretched(contention_profile p, double slowdown);

}  // namespace ashlar
