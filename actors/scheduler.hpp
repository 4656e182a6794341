// The scheduler actor: membership, the shard map, and the end of the job. What it decides
// while the job runs (local steps, stages, k, batch shares) is its job planner's
// (runtime/policy/job_planner.hpp); what a registering worker is told is
// runtime/policy/assignment.hpp's. The actor routes.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/policy/assignment.hpp"
#include "runtime/tensor/layout.hpp"

namespace ashlar {
class run_recorder;
}

namespace ashlar::actors {

struct scheduler_config {
  /// The job: model, workers expected (train.workers), batch, epochs, seed, policy,
  /// chunking and pacing settings.
  train_config job;
  std::vector<shard_range> ranges;
  std::vector<shard_actor> shards; // shards[i] owns ranges[i]
  /// Per shard, its data-plane endpoint "host:port" ("": CAF only); empty: none at all.
  std::vector<std::string> data_endpoints;
  /// Key workers present to the shards' data planes.
  std::string data_key;
  profiler_actor profiler;
  /// Training samples the workers split between them.
  uint64_t train_size = 0;
  /// The part of the job's epochs still to train (a resumed job: 1 - done / budget).
  double remaining = 1.0;
  /// A resumed job's training stage when it stopped ("shl": ASHL goes to SHL after
  /// profiling again); "" otherwise.
  std::string resume_stage;
  /// Where the scheduler leaves the stage in force (an ashl_stage; -1: none), read by the
  /// job driver for its resume record.
  std::shared_ptr<std::atomic<int>> stage_out;
  /// Where the scheduler keeps the count of lost members' untrained samples it handed to
  /// the others (for the job's report), if set.
  std::shared_ptr<std::atomic<uint64_t>> reassigned_out;
  /// A resumed job's members as the checkpointed job left them: each id's batch share
  /// and data position. A worker registering with that id starts from them.
  std::map<uint32_t, resumed_worker> resume_workers;
  /// Slowdown intervals for paced workers (loaded from job.contention).
  contention_profile contention;
  /// Longest the first registered worker waits for the others before training starts
  /// with the workers present. Default: 120 s.
  std::chrono::milliseconds start_timeout{120000};
  /// Every worker lost with steps still to train (their nodes lost, all at once): how
  /// long to wait for a worker to join and take their steps up before the job ends with
  /// them failed. 0 (a job in one process, where none can join): it ends at once.
  std::chrono::milliseconds worker_wait{0};
  /// Receives (done_atom, uint32_t finished, uint32_t failed, std::string first_failure:
  /// "worker ID: why", empty when none failed, std::string job_error: why the job fails,
  /// a worker's own computation having failed, empty when it does not) once every registered
  /// worker has left and at least expected_workers have registered (and, with
  /// worker_wait, no lost worker's steps wait for a newcomer); and (start_atom, uint32_t
  /// workers) when training starts.
  caf::actor observer;
  /// Where stage changes, policy retunes, joins and leaves are recorded (the run's
  /// trace and metrics files), if anywhere.
  std::shared_ptr<run_recorder> recorder;
};

/// Spawns the scheduler. Before answering a registration it has every shard and the
/// profiler acknowledge the new member, so the worker's first push finds it live.
scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg);

}  // namespace ashlar::actors
