// One job's lifecycle on a cluster, from its submission to its one outcome: it waits for
// the nodes it needs (with a deadline), runs, may be asked to stop, and ends trained,
// stopped or failed, with the cause named. Pure: events in, actions out, time from a
// clock_source; the cluster actor and the simulator (tests/sim) feed it the same events.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/clock.hpp"

namespace ashlar::control {

/// What the cluster offers a job now: live server nodes and free worker slots.
struct capacity {
  uint32_t server_nodes = 0;
  uint32_t worker_slots = 0;
};

/// What a job needs before it starts: a server node for its shards (a node hosts several)
/// and a worker slot per worker.
struct job_needs {
  uint32_t shards = 1;
  uint32_t workers = 1;
};

/// What the job still lacks, in words ("" when nothing).
std::string lacking(const job_needs& needs, const capacity& have);

/// How a job ended. `cause` names who stopped it or what failed; empty when it trained.
struct job_outcome {
  enum kind_t : uint8_t { trained, stopped, failed };
  kind_t kind = trained;
  std::string cause;
};
const char* to_string(job_outcome::kind_t k);

/// What the adapter does for the machine.
struct job_action {
  enum kind_t : uint8_t {
    start,        ///< the cluster has what the job needs: place its shards and workers
    waiting,      ///< `text`: what it still lacks (status and the log); it changed
    stop_workers, ///< ask every worker to finish its step and leave
    ended,        ///< the job ended: outcome() says how; answer the submitter
  };
  kind_t kind;
  std::string text;
};

class job_lifecycle {
public:
  enum class phase : uint8_t { waiting, running, stopping, ended };

  /// A job submitted now that needs `needs` and waits for them at most `wait_ns`.
  job_lifecycle(const clock_source& clock, job_needs needs, uint64_t wait_ns);

  /// The cluster's capacity changed (a node joined or was lost), or is first told.
  std::vector<job_action> on_capacity(const capacity& have);
  /// Time passed: the wait for nodes may have run out. Call at deadline() or later.
  std::vector<job_action> on_time();
  /// A stop was asked for (`who`: "ashlar ctl stop-job", "the cluster was shut down", "the
  /// submitter was interrupted"): a waiting job ends at once, a running one stops its workers.
  std::vector<job_action> on_stop(const std::string& who);
  /// A worker's own computation failed (its script raised): the job fails, naming it, and
  /// the other workers stop.
  std::vector<job_action> on_worker_error(const std::string& what);
  /// The run came back: `error` empty when it ended well (`trained_all`: it trained its
  /// epochs or reached its target), else why it failed.
  std::vector<job_action> on_run_ended(const std::string& error, bool trained_all = true);

  phase state() const { return phase_; }
  /// When on_time() must be called next (steady ns), if anything waits for time.
  std::optional<uint64_t> deadline() const;
  /// Valid once state() is ended.
  const job_outcome& outcome() const { return outcome_; }
  /// What the job lacked when it last waited ("" once it has all it needs).
  const std::string& lacks() const { return lacks_; }
  /// The text a submitter is told: "trained", "stopped: WHO", "failed: WHAT", or before the
  /// start "stopped while waiting for the job's nodes: it LACKS (WHO)", "the job's nodes did
  /// not join in time: it LACKS (waited N s)".
  std::string summary() const;

private:
  std::vector<job_action> end(job_outcome::kind_t kind, std::string cause);

  const clock_source& clock_;
  job_needs needs_;
  uint64_t wait_until_;
  uint64_t wait_ns_;
  phase phase_ = phase::waiting;
  bool started_ = false;
  std::string lacks_;
  std::string stop_cause_;  // who asked it to stop, if anyone did
  std::string error_cause_; // a worker's error, if one failed
  job_outcome outcome_;
};

}  // namespace ashlar::control
