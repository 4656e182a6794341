// A server or worker node's lifecycle after it joined its scheduler: serving, losing the
// scheduler (a grace for a shutdown it was told of), probing until the scheduler at the
// same address admits it again, letting a frozen scheduler drop its old connections,
// joining it again, or giving up with a reason; and draining on a stop signal. Pure:
// events in, actions out, time from a clock_source. `ashlar node` turns messages,
// signals and the results of its probes into these events and carries out the actions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/clock.hpp"

namespace ashlar::control {

struct node_timing {
  /// After the scheduler's connection ends: how long a shutdown message may still come
  /// (the scheduler's exit can overtake it). Default: 1 s.
  uint64_t lost_grace_ns = 1000000000ull;
  /// How long to wait for a lost scheduler to come back (--rejoin-timeout); 0: exit at
  /// once. Default: 60 s.
  uint64_t rejoin_ns = 60000000000ull;
  /// Between two probes of a scheduler that did not answer. Default: 0.5 s.
  uint64_t probe_gap_ns = 500000000ull;
  /// Once it answers: its heartbeat check's time to drop the old connections. Default: 4.5 s.
  uint64_t settle_ns = 4500000000ull;
  /// A stop signal lets the hosted workers finish their step for at most this. Default: 30 s.
  uint64_t drain_ns = 30000000000ull;
};

struct node_action {
  enum kind_t : uint8_t {
    stop_hosted, ///< stop the shards and workers it hosts (its scheduler is gone)
    probe,       ///< try whether the scheduler admits a connection; answer on_probe
    rejoin,      ///< join the scheduler again (for at most `wait_ns`); answer on_rejoin
    drain,       ///< ask the hosted workers to finish their step and leave
    log_warn,    ///< `text` for the log
    log_info,
    exit,        ///< the node exits with `code`; `text`, if any, says why
  };
  kind_t kind;
  std::string text;
  int code = 0;
  uint64_t wait_ns = 0;
};

class node_lifecycle {
public:
  enum class phase : uint8_t { serving, lost, probing, settling, rejoining, draining, ended };

  /// `scheduler`: "HOST:PORT", named in messages. `may_rejoin`: false for a node that is
  /// the scheduler itself (it never waits for another).
  node_lifecycle(const clock_source& clock, std::string scheduler, node_timing timing, bool may_rejoin = true);

  /// The scheduler's connection ended (`reason`).
  std::vector<node_action> on_scheduler_down(const std::string& reason);
  /// The cluster told the node to shut down (or the job it ran is over and it should exit).
  std::vector<node_action> on_shutdown();
  /// A stop signal (SIGINT/SIGTERM) named `signal`; a second one ends the node at once.
  /// `holds_shards`: the node serves shards of a running job, which its workers (on every
  /// node) still need to finish their step and the scheduler its final snapshot: it keeps
  /// them until the scheduler ends the job (its shutdown, or its loss), for at most the
  /// drain time, rather than stopping them now (`ashlar node --hold-shards-on-signal`:
  /// under Slurm's scancel every process gets the signal at once).
  std::vector<node_action> on_signal(const std::string& signal, bool holds_shards = false);
  /// The hosted workers have all left after a drain.
  std::vector<node_action> on_drained();
  /// A probe's answer: admitted, refused for good (another token, protocol), or failed.
  enum class answer : uint8_t { admitted, refused, failed };
  std::vector<node_action> on_probe(answer a, const std::string& detail);
  /// A rejoin's answer (`detail`: admitted, the node's new name, "node 7"; else the error).
  std::vector<node_action> on_rejoin(answer a, const std::string& detail);
  /// Time passed: call at deadline() or later.
  std::vector<node_action> on_time();

  phase state() const { return phase_; }
  std::optional<uint64_t> deadline() const;
  /// How many times it joined the scheduler again.
  uint32_t rejoins() const { return rejoins_; }

private:
  std::vector<node_action> give_up(const std::string& why);
  std::vector<node_action> rejoin_now();

  const clock_source& clock_;
  std::string scheduler_;
  node_timing t_;
  bool may_rejoin_;
  bool holding_ = false;     // draining: it holds its shards until the job ends
  phase phase_ = phase::serving;
  std::string reason_;       // why the scheduler was lost
  uint64_t until_ = 0;       // the current phase's deadline
  uint64_t give_up_at_ = 0;  // end of the rejoin wait
  std::string last_failure_; // the last probe's or rejoin's error
  uint32_t rejoins_ = 0;
};

}  // namespace ashlar::control
