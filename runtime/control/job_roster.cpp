#include "runtime/control/job_roster.hpp"

namespace ashlar::control {

job_roster::job_roster(const clock_source& clock, uint32_t expected, uint64_t start_timeout_ns,
                       uint64_t joiner_wait_ns, uint32_t min_workers)
  : clock_(clock), expected_(expected), min_workers_(min_workers), start_timeout_ns_(start_timeout_ns), joiner_wait_ns_(joiner_wait_ns) {}

job_roster::action job_roster::ready() {
  if (phase_ != phase::barrier || stopped_)
    return action::none;
  if (ready_++ == 0)
    first_ready_ns_ = clock_.steady_ns();
  if (ready_ < expected_)
    return action::none;
  phase_ = phase::running;
  began_ = true;
  return action::start;
}

job_roster::action job_roster::timer() {
  const uint64_t now = clock_.steady_ns();
  if (phase_ == phase::barrier && !stopped_ && ready_ > 0 && now - first_ready_ns_ >= start_timeout_ns_) {
    phase_ = phase::running;
    began_ = true;
    return action::start;
  }
  if (phase_ == phase::waiting_for_joiner && now - waiting_since_ns_ >= joiner_wait_ns_) {
    phase_ = phase::ended;
    return action::end;
  }
  return action::none;
}

uint64_t job_roster::next_timer() const {
  if (phase_ == phase::barrier && !stopped_ && ready_ > 0)
    return first_ready_ns_ + start_timeout_ns_;
  if (phase_ == phase::waiting_for_joiner)
    return waiting_since_ns_ + joiner_wait_ns_;
  return 0;
}

void job_roster::joined() {
  if (phase_ == phase::waiting_for_joiner)
    phase_ = phase::running;
}

bool job_roster::may_wait(uint32_t lost, bool stopping, bool failed) const {
  return phase_ == phase::running && lost > 0 && !stopping && !failed && joiner_wait_ns_ > 0;
}

job_roster::action job_roster::all_left(uint32_t lost, uint64_t untaken, bool stopping, bool failed) {
  if (phase_ == phase::ended || phase_ == phase::waiting_for_joiner)
    return action::none;
  if (may_wait(lost, stopping, failed) && untaken > 0) {
    phase_ = phase::waiting_for_joiner;
    waiting_since_ns_ = clock_.steady_ns();
    return action::wait_for_joiner;
  }
  phase_ = phase::ended;
  return action::end;
}

void job_roster::stop_before_start() {
  if (phase_ == phase::barrier)
    stopped_ = true;
}

}  // namespace ashlar::control
