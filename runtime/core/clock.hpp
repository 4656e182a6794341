// Time as Ashlar's code reads it. The wall clock as one number, for timestamps that cross
// processes (traces, checkpoint records, job records); steady nanoseconds for durations.
// Pure code that measures time takes a clock_source, so a test can drive time itself
// (manual_clock) instead of sleeping.
#pragma once

#include <chrono>
#include <cstdint>

namespace ashlar {

/// Nanoseconds since the Unix epoch, now.
inline int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
    .count();
}

/// Where a class reads the time.
class clock_source {
public:
  virtual ~clock_source() = default;
  /// Monotonic nanoseconds from an arbitrary start: for durations.
  virtual uint64_t steady_ns() const = 0;
  /// Nanoseconds since the Unix epoch: for timestamps.
  virtual int64_t wall_ns() const = 0;
};

/// The machine's clocks (std::chrono::steady_clock and system_clock).
class system_clock_source final : public clock_source {
public:
  uint64_t steady_ns() const override {
    return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count());
  }
  int64_t wall_ns() const override { return unix_ns(); }
};

/// One system_clock_source for everybody.
inline const clock_source& system_clock() {
  static const system_clock_source clock;
  return clock;
}

/// A clock that moves only when told: steady time starts at 1 s, the wall clock at a
/// fixed date, and advance() moves both.
class manual_clock final : public clock_source {
public:
  uint64_t steady_ns() const override { return now_; }
  int64_t wall_ns() const override { return wall_start_ + static_cast<int64_t>(now_); }
  void advance(uint64_t ns) { now_ += ns; }
  void advance(std::chrono::nanoseconds d) { now_ += static_cast<uint64_t>(d.count()); }

private:
  uint64_t now_ = 1000000000ull;
  int64_t wall_start_ = 1767225600000000000ll; // 2026-01-01
};

}  // namespace ashlar
