// Time as Ashlar's code reads it, and waits on it: the one clock. The wall clock as one
// number, for timestamps that cross processes (traces, checkpoint records, job records);
// steady nanoseconds for durations; a wait of a given length. Pure code that measures
// time takes a clock_source, so a test can drive time itself (manual_clock) instead of
// sleeping; code that reads or waits on the machine's time does it here (system_clock(),
// steady_now(), pause_for()), never through std::chrono's clocks or sleep directly.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

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
  /// Waits `ns` nanoseconds of this clock's time: the machine's clock sleeps; a manual
  /// clock moves on by that much at once.
  virtual void wait_ns(uint64_t ns) const = 0;
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
  void wait_ns(uint64_t ns) const override { std::this_thread::sleep_for(std::chrono::nanoseconds{ns}); }
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
  void wait_ns(uint64_t ns) const override { now_ += ns; }
  void advance(uint64_t ns) { now_ += ns; }
  void advance(std::chrono::nanoseconds d) { now_ += static_cast<uint64_t>(d.count()); }

private:
  mutable uint64_t now_ = 1000000000ull;
  int64_t wall_start_ = 1767225600000000000ll; // 2026-01-01
};

/// Steady time from `clock` as a std::chrono time point (for deadlines and durations).
inline std::chrono::steady_clock::time_point steady_now(const clock_source& clock = system_clock()) {
  return std::chrono::steady_clock::time_point{
    std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::nanoseconds{clock.steady_ns()})};
}

/// Waits `d` on `clock` (the machine's: a sleep).
template <class Rep, class Period>
void pause_for(std::chrono::duration<Rep, Period> d, const clock_source& clock = system_clock()) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  clock.wait_ns(ns > 0 ? static_cast<uint64_t>(ns) : 0);
}

}  // namespace ashlar
