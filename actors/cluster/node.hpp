// The node actor: what every node process runs. It hosts shards and workers when the
// scheduler asks, and stops them on control requests.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "actors/gpu_actor.hpp"
#include "actors/interfaces.hpp"

namespace ashlar::actors {

class data_plane;

struct node_config {
  /// A name for logs, e.g. "host:pid". Default: "".
  std::string name;
  /// What this node may host.
  std::vector<wire::role> roles;
  /// How many workers this node may host. Default: 1.
  uint32_t slots = 1;
  /// If not empty, workers here read the data set from this directory instead of the
  /// job's data.dir. Default: "".
  std::string data_dir;
  /// Serves this node's shards to workers elsewhere, and connects its workers to shards
  /// elsewhere. Default: none (every pull and push over CAF).
  std::shared_ptr<data_plane> plane;
  /// The address other nodes reach this one's data plane at. Default: "127.0.0.1".
  std::string data_host = "127.0.0.1";
  /// Receives (stop_atom) once a shutdown request has stopped every local worker.
  caf::actor owner;
  /// Shards hosted here checkpoint into DIR/shard-ID, whatever directory the job names
  /// (a job with no checkpoint directory still has none). Default: "" (the job's).
  std::string checkpoint_dir;
  /// A job's own checkpoint directory must lie under this one (it comes from whoever
  /// submitted the job); a job naming another is refused. Default: "" (no bound: the
  /// embedding application decides).
  std::string work_dir;
  /// GPUs for the workers hosted here, one each; the others compute on the CPU.
  /// Default: none.
  std::shared_ptr<gpu_pool> gpus;
  /// The backend of the workers hosted here (a host application's own); wins over gpus.
  backend_factory make_backend;
  /// If set, kept at the number of shards this node hosts now (its process holds them
  /// through a stop signal until their job ends). Default: none.
  std::shared_ptr<std::atomic<uint32_t>> shards_hosted;
};

/// Spawns the node actor. Spawn requests for a role the node lacks, or beyond its slots,
/// are refused with invalid_state; a data set that cannot be loaded, with its error.
node_actor spawn_node(caf::actor_system& sys, node_config cfg);

/// "scheduler,server,worker" <-> roles.
[[nodiscard]] expected<std::vector<wire::role>> parse_roles(const std::string& text);
std::string to_string(const std::vector<wire::role>& roles);
bool has_role(const std::vector<wire::role>& roles, wire::role r);

}  // namespace ashlar::actors
