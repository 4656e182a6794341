// What a progress line says of time, the same for a local run and a cluster job: the
// stamp the log lines carry (wall clock, "[15:22:01.123]"), the time the run has been
// training, and how long it has left at its recent rate.
#pragma once

#include <cstdint>
#include <string>

namespace ashlar {

/// A duration for a person: "45s", "1m05s", "2h03m".
std::string short_duration(double seconds);

/// "12.0 s in, about 1m05s left": the samples still to train at `recent_rate` samples/s
/// (the run's average where there is no recent rate). Only "12.0 s in" before 1% of the
/// samples are trained, with nothing to train, or with no rate at all.
std::string time_left(double elapsed_s, uint64_t done_samples, uint64_t total_samples, double recent_rate);

/// The stamp log lines carry, for wall-clock time `unix_ns`: "[15:22:01.123]" (local time).
std::string log_stamp(int64_t unix_ns);

}  // namespace ashlar
