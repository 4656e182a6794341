// The wall clock as one number, for timestamps that cross processes (traces, checkpoint
// records, job records). Durations use std::chrono::steady_clock instead.
#pragma once

#include <chrono>
#include <cstdint>

namespace ashlar {

/// Nanoseconds since the Unix epoch, now.
inline int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
    .count();
}

}  // namespace ashlar
