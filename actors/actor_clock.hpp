// The clock an actor hands the machines it drives: the actor system's own clock
// (caf::actor_clock), the one its timers (delayed_send, request timeouts) run on, so that a
// machine's deadline and the timer armed for it read one time. In production that is the
// steady clock; under CAF's test coordinator it is the test's, which moves only as the test
// triggers timeouts, so protocol tests drive the machines' deadlines without sleeping.
#pragma once

#include <chrono>

#include <caf/actor_clock.hpp>
#include <caf/actor_system.hpp>

#include "runtime/core/clock.hpp"

namespace ashlar::actors {

class actor_clock_source final : public clock_source {
public:
  /// Unbound (until bind): the machine's steady clock.
  actor_clock_source() = default;
  explicit actor_clock_source(caf::actor_system& sys) : clock_(&sys.clock()) {}
  /// From now on the time of `sys`'s clock (an actor's state binds it as the actor starts).
  void bind(caf::actor_system& sys) { clock_ = &sys.clock(); }

  uint64_t steady_ns() const override {
    if (clock_ == nullptr)
      return system_clock().steady_ns();
    return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_->now().time_since_epoch()).count());
  }
  /// Timestamps that cross processes stay the machine's.
  int64_t wall_ns() const override { return system_clock().wall_ns(); }
  void wait_ns(uint64_t ns) const override { system_clock().wait_ns(ns); }

private:
  caf::actor_clock* clock_ = nullptr;
};

}  // namespace ashlar::actors
