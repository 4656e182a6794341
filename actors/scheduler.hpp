// The scheduler actor: membership, the shard map, each worker's data and batch share,
// and the end of the job.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/model/mlp.hpp"
#include "runtime/tensor/layout.hpp"

namespace ashlar::actors {

struct scheduler_config {
  mlp_spec model;
  std::vector<shard_range> ranges;
  std::vector<shard_actor> shards; // shards[i] owns ranges[i]
  profiler_actor profiler;
  /// Training samples the workers split between them.
  uint64_t train_size = 0;
  /// Workers the job waits for before it can be done.
  uint32_t expected_workers = 1;
  uint32_t batch_size = 64;
  uint32_t epochs = 1;
  uint64_t seed = 1;
  std::string policy;
  uint64_t chunk_floats = 1 << 20;
  uint32_t chunks_in_flight = 2;
  /// Pacing (see train_config::speeds): empty = unpaced.
  std::vector<double> speeds;
  double sample_ms = 0.5;
  /// Longest the first registered worker waits for the others before training starts
  /// with the workers present. Default: 120 s.
  std::chrono::milliseconds start_timeout{120000};
  /// Receives (done_atom, uint32_t finished, uint32_t failed) once every registered
  /// worker has left and at least expected_workers have registered.
  caf::actor observer;
};

/// Spawns the scheduler. Before answering a registration it has every shard and the
/// profiler acknowledge the new member, so the worker's first push finds it live.
scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg);

}  // namespace ashlar::actors
