// The scheduler's roster of one job's workers, from the start barrier to the end. The first
// round's workers wait at a barrier until the job's expected number is ready (registered,
// every shard knowing them), or until the start timeout after the first one, when training
// starts with those that came. Once every member has gone, the job ends, unless lost members
// left steps nobody took up and a worker may still join (a node that comes back, ctl
// add-worker): then the job waits for one up to the joiner wait, and fails if none comes.
//
// Pure, on a clock_source: the scheduler actor (actors/scheduler.cpp) and the simulator
// (tests/sim) feed it the same events, and arm a timer for next_timer().
#pragma once

#include <cstdint>

#include "runtime/core/clock.hpp"

namespace ashlar::control {

class job_roster {
public:
  enum class action : uint8_t {
    none,
    start,           ///< training starts with the workers at the barrier
    end,             ///< the job ends: every member is gone (or none joined in time)
    wait_for_joiner, ///< every member is gone with steps left: wait until next_timer()
  };
  enum class phase : uint8_t { barrier, running, waiting_for_joiner, ended };

  /// A job of `expected` workers; `start_timeout_ns` after the first is ready, training
  /// starts with those that came; `joiner_wait_ns` (0: none) is how long a job whose
  /// members were all lost waits for one to join.
  job_roster(const clock_source& clock, uint32_t expected, uint64_t start_timeout_ns, uint64_t joiner_wait_ns,
             uint32_t min_workers = 1);

  /// A worker of the first round is ready: `start` once the job's expected workers are.
  action ready();
  /// A timer fired: the barrier's timeout (`start`, if it passed and any worker came) or
  /// the wait for a joiner (`end`, if it passed). Early or stale timers do nothing.
  action timer();
  /// When the adapter's next timer should fire (steady ns), 0 when none is due.
  uint64_t next_timer() const;
  /// A worker joined the running job: a wait for one is over.
  void joined();
  /// Whether, with every member gone, the untaken steps matter (the adapter then asks for
  /// them): `lost` members were lost, and the job neither stops nor failed.
  bool may_wait(uint32_t lost, bool stopping, bool failed) const;
  /// Whether a running job that lost members and has `live` workers left must fail: fewer
  /// than its train.min_workers (above 1: with 1, a job that lost every worker waits for a
  /// joiner instead).
  bool too_few(uint32_t live) const { return started() && min_workers_ > 1 && live < min_workers_; }
  uint32_t min_workers() const { return min_workers_; }
  /// Every member has gone; `untaken`: the steps lost members left that nobody took up.
  /// Before the start (the caller waits while the first round is still registering) the
  /// job ends: its workers came and went.
  action all_left(uint32_t lost, uint64_t untaken, bool stopping, bool failed);
  /// The job stopped before its barrier (a shutdown): it ends once every worker that came
  /// has left; no start.
  void stop_before_start();

  phase state() const { return phase_; }
  bool started() const { return phase_ == phase::running || phase_ == phase::waiting_for_joiner; }
  /// Training started (the barrier filled or timed out), whether or not the job ended since.
  bool began() const { return began_; }
  uint32_t at_barrier() const { return ready_; }
  uint32_t expected() const { return expected_; }

private:
  const clock_source& clock_;
  uint32_t expected_;
  uint32_t min_workers_;
  uint64_t start_timeout_ns_, joiner_wait_ns_;
  phase phase_ = phase::barrier;
  uint32_t ready_ = 0;
  bool stopped_ = false;
  bool began_ = false;
  uint64_t first_ready_ns_ = 0, waiting_since_ns_ = 0;
};

}  // namespace ashlar::control
