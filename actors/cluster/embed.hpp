// Joining a cluster from any process: a host application with its own actor_system hosts
// Ashlar workers (or shards) next to its own actors. `ashlar node` uses the same call.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster/system.hpp"
#include "actors/gpu_actor.hpp"

namespace ashlar::actors {

class data_plane;

struct join_options {
  /// Name shown in the scheduler's logs and `ashlar status`. Default: "embedded".
  std::string name = "embedded";
  /// Roles this process takes. Default: worker.
  std::vector<wire::role> roles = {wire::role::worker};
  /// Workers this process may host. Default: 1.
  uint32_t slots = 1;
  /// If not empty, read the data set from here instead of the job's data.dir. Default: "".
  std::string data_dir;
  /// How long to keep trying to reach the scheduler. Default: 30 s.
  std::chrono::milliseconds timeout{30000};
  /// Announced protocol version (tests use another one to check refusals).
  uint32_t protocol = wire::protocol_version;
  /// If set, shards hosted here serve workers elsewhere on direct data connections, and
  /// workers here use them (see data_plane.hpp). Default: none (CAF only).
  std::shared_ptr<data_plane> plane;
  /// Address other nodes reach this one's data plane at. Default: "": the local address
  /// on the route to the scheduler.
  std::string data_host;
  /// Receives (stop_atom) when the cluster shut this node down and its workers have left.
  caf::actor owner;
  /// Shards hosted here checkpoint into DIR/shard-ID when a job asks for checkpoints.
  /// Default: "" (the directory the job names).
  std::string checkpoint_dir;
  /// A job's checkpoint directory must lie under this one (see node_config::work_dir).
  /// Default: "" (no bound).
  std::string work_dir;
  /// >= 0: this node offers to serve that shard of the running job again, restored from
  /// its checkpoints (its earlier node was lost). Default: -1.
  int64_t replace_shard = -1;
  /// GPUs for the workers hosted here, one each (see gpu_pool); the others compute on
  /// the CPU. Default: none (every worker on the CPU).
  std::shared_ptr<gpu_pool> gpus;
  /// The compute backend of the workers hosted here: the host application's own, for
  /// example its network in LibTorch, for a model with an `external` layer (see
  /// runtime/model/model.hpp). Wins over gpus. Default: none (GPUs, then the CPU).
  backend_factory make_backend;
  /// If set, kept at the number of shards this node hosts now (see node_config). Default: none.
  std::shared_ptr<std::atomic<uint32_t>> shards_hosted;
};

/// A process's membership in a cluster.
struct membership {
  cluster_actor cluster;
  node_actor node;
  uint32_t node_id = 0;
};

/// Spawns a node actor in `sys` and introduces it to the scheduler reachable at `where`
/// (or to `local`, when this process runs the scheduler itself). Blocks until welcomed.
/// The connection is admitted by the process's cluster_network (network.hpp): start one
/// with the cluster's token and TLS credentials first.
/// Errors: peer_unreachable naming the address; handshake_refused with the scheduler's reason.
[[nodiscard]] expected<membership> join_cluster(caf::actor_system& sys, const endpoint& where,
                                                const join_options& opts);
[[nodiscard]] expected<membership> join_cluster(caf::actor_system& sys, const cluster_actor& local,
                                                const join_options& opts);

/// Introduces an existing node actor (one that lost its scheduler and stopped what it
/// hosted: see node_actor's stop_atom) to the scheduler at `where` again, for example a
/// scheduler restarted with --resume. The node keeps the data sets it loaded.
/// Errors: as join_cluster's.
[[nodiscard]] expected<membership> rejoin_cluster(caf::actor_system& sys, const endpoint& where,
                                                  const join_options& opts, const node_actor& node);

}  // namespace ashlar::actors
