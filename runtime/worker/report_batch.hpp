// A worker's step reports on their way to the profiler, sent a few at a time: a report per
// step is a message per step (across processes, a wake-up of the worker's and the
// scheduler's network threads and of the profiler's), which at hundreds of steps a second
// cost the job more than the profiler's use of them. Reports are held for at most
// `window` after the first of a batch (one timer per batch), or until `most` are held,
// and in order; whatever is held goes when the worker leaves. Pure code: the actor keeps
// the timer.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/wire/messages.hpp"

namespace ashlar {

class report_batch {
public:
  /// `window_ns` 0: every report goes at once.
  explicit report_batch(uint64_t window_ns, size_t most = 16) : window_ns_(window_ns), most_(most) {}

  /// What to do after a report was added.
  enum class next : uint8_t {
    send,      // send what take() gives now
    arm_timer, // hold it; call on_timer() after window_ns()
    hold,      // hold it (a timer is pending)
  };
  next add(wire::profile_report r);
  /// The batch's timer: whatever is held is due (send what take() gives).
  void on_timer() { armed_ = false; }
  /// The held reports, in order; none held afterwards.
  std::vector<wire::profile_report> take();

  uint64_t window_ns() const { return window_ns_; }
  size_t held() const { return held_.size(); }

private:
  uint64_t window_ns_;
  size_t most_;
  bool armed_ = false;
  std::vector<wire::profile_report> held_;
};

}  // namespace ashlar
