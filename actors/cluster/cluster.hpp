// The scheduler process's front door (the cluster actor) and the placement that puts a
// job's shards and workers on the nodes that joined it.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "actors/job_driver.hpp"
#include "actors/interfaces.hpp"

namespace ashlar::actors {

struct cluster_config {
  /// This scheduler's address, for logs and welcomes.
  std::string address;
  /// Receives (wire::job_request) for jobs submitted with `ashlar train --join`; the
  /// runner answers with (job_atom, wire::job_result) or (job_atom, caf::error) to the
  /// cluster actor. May be null: submitted jobs are then refused.
  caf::actor runner;
};

/// Spawns the cluster actor. Refuses a hello with another protocol version
/// (handshake_refused, saying expected and actual). The token and TLS certificates were
/// checked when the connection was admitted (network.hpp), before any message.
cluster_actor spawn_cluster(caf::actor_system& sys, cluster_config cfg);

/// Places shards round-robin on server nodes and workers on worker nodes' free slots.
class cluster_placement final : public job_placement {
public:
  cluster_placement(caf::actor_system& sys, cluster_actor cluster);

  expected<std::vector<shard_actor>> make_shards(const std::vector<shard_range>& ranges,
                                                 const std::vector<float>& init, const train_config& cfg,
                                                 double average_samples) override;

  caf::error start_workers(const train_config& cfg, const scheduler_actor& scheduler,
                           const profiler_actor& profiler,
                           std::shared_ptr<const dataset> train) override;

  std::vector<std::string> data_endpoints() const override { return endpoints_; }
  std::string data_key() const override { return key_; }

  bool takes_joiners() const override { return true; }

  void on_job_end() override;

private:
  caf::actor_system& sys_;
  cluster_actor cluster_;
  std::vector<shard_actor> shards_;
  std::vector<wire::spawn_shard> templates_; // how each shard was spawned
  std::vector<std::string> endpoints_;
  std::string key_;
  std::vector<worker_actor> workers_;
};

/// Blocks until the cluster has a server node for the job's `servers` shards (a node
/// hosts several) and `worker_slots` worker slots. The cluster actor's job lifecycle
/// decides (runtime/control/job_lifecycle.hpp) and tells `ashlar status` and the log what
/// the job lacks; this fails with peer_unreachable after `timeout`, and with cancelled when
/// the job is stopped while it waits (`ashlar ctl stop-job`, `ctl shutdown`, or `stopping`,
/// the process's stop signal, checked every 200 ms), both naming what it lacked.
[[nodiscard]] caf::error wait_for_nodes(caf::actor_system& sys, const cluster_actor& cluster,
                                        uint32_t servers, uint32_t worker_slots,
                                        std::chrono::milliseconds timeout,
                                        const std::function<bool()>& stopping = {});

}  // namespace ashlar::actors
