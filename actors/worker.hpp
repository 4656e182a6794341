// The worker actor: registers with the scheduler, then loops pull -> compute -> push over
// its share of the data until its steps are done, reporting each step to the profiler.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/gpu_actor.hpp"
#include "actors/interfaces.hpp"
#include "runtime/backend/compute_backend.hpp"
#include "runtime/data/dataset.hpp"

namespace ashlar::actors {

class data_plane;

struct worker_config {
  scheduler_actor scheduler;
  profiler_actor profiler;
  /// The training set; the scheduler's assignment names this worker's part of it.
  std::shared_ptr<const dataset> data;
  /// Makes the compute backend once the model is known (a GPU's, see gpu_pool), and says
  /// where it computes. Default: the CPU backend.
  backend_factory make_backend;
  /// Requested worker id; wire::any_worker lets the scheduler choose.
  uint32_t requested_id = wire::any_worker;
  /// Where this worker runs, for logs.
  std::string host;
  /// Longest a pull or push may take, policy waits included. Default: 120 s.
  std::chrono::milliseconds request_timeout{120000};
  /// If set, pulls from and pushes to shards in other processes go over this data plane
  /// when the assignment names their data endpoints. Default: none (CAF only).
  std::shared_ptr<data_plane> plane;
  /// If set (with `plane`), the host the plane listens on for the ring chunks of workers in
  /// other processes (a ring job's), and the job's data-plane key under which it takes
  /// them: the worker registers that endpoint, and the previous worker on the ring sends
  /// its chunks there (through shared memory from the same host). Default: "" (chunks over
  /// CAF).
  std::string ring_host;
  std::string ring_key;
  /// Whether a step's buffers (gradient, batch, the CPU backend's activations) are given
  /// back between steps (step_machine::give_back_between_steps): set where one process
  /// hosts more workers than it has cores, so that they compute a few at a time and held
  /// buffers would mostly lie idle. Costs a few percent of step time. Default: no.
  bool give_back_between_steps = false;
  /// Longest a step's report is held to go to the profiler with the next ones
  /// (runtime/worker/report_batch.hpp) under a lockstep policy (workers at their own pace
  /// send each at once: the job's end counts their samples); 0: each at once. Default:
  /// 25 ms, a quarter of the scheduler's tick.
  std::chrono::milliseconds report_window{25};
};

/// Spawns a worker; it starts when it receives start_atom. On any error (a shard
/// unreachable or refusing, a bad assignment, a non-finite loss) it tells the scheduler
/// it failed, with the reason, and stops.
worker_actor spawn_worker(caf::actor_system& sys, worker_config cfg);

/// Spawns and starts `n` workers of this process, ids 0 .. n-1, each configured as `base`
/// with its backend from `next_backend()` (called once per worker, in id order; empty:
/// `base`'s). A local job's workers.
std::vector<worker_actor> start_local_workers(caf::actor_system& sys, uint32_t n, const worker_config& base,
                                              const std::function<backend_factory()>& next_backend = {});

}  // namespace ashlar::actors
