// The scheduler's table of nodes: who is live, the worker slots each is granted (bounded,
// whatever a node asks), and the running job's workers on each. A node's loss is one
// event that takes all its workers with it. Pure: the cluster actor and the simulator
// (tests/sim) feed it the same events.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "runtime/control/job_lifecycle.hpp"

namespace ashlar::control {

/// What one node can make the scheduler hold.
struct membership_limits {
  /// Most worker slots one node is granted, whatever it offers (`ashlar node --slots`).
  /// Default: 256.
  uint32_t slots_per_node = 256;
  /// Most nodes the cluster admits at once. Default: 4096.
  uint32_t max_nodes = 4096;
  /// How long a welcomed node has to confirm its welcome before it is lost (it never got
  /// it, or died first). Default: 15 s.
  uint64_t confirm_within_ns = 15'000'000'000ull;
};

class cluster_membership {
public:
  explicit cluster_membership(membership_limits limits = {}) : limits_(limits) {}

  struct admission {
    bool admitted = false;
    uint32_t slots = 0;   ///< granted: min(offered, slots_per_node)
    std::string note;     ///< why it got fewer than it offered, or why it was refused
    /// The live node of the same connection, which this one replaces: the adapter loses it.
    std::optional<uint32_t> replaces;
  };
  /// Node `id` joined, a server node or not, offering `slots` worker slots, over
  /// `connection` (the peer process it came from; "" for this process). It is welcomed,
  /// and serves (gets workers and shards, counts in free()) once it confirms the welcome.
  /// One connection is one node: a join over the connection of a live node replaces it (a
  /// node that rejoins before its old entry was lost, or a member repeating its hello
  /// holds one entry, never fills the table).
  admission on_join(uint32_t id, bool server, uint32_t slots, const std::string& connection = {});
  /// Node `id` confirmed its welcome: true the first time, for a live node (the adapter then
  /// starts workers and shards on it).
  bool on_confirmed(uint32_t id);
  /// The adapter's timer, confirm_within_ns after the join: true if node `id` is live and has
  /// not confirmed (the adapter then loses it).
  bool confirm_due(uint32_t id) const;
  /// Whether node `id` is live and confirmed its welcome.
  bool serving(uint32_t id) const;
  /// Node `id` was lost: the running job's workers it hosted, all lost in this one event
  /// (0 for a node unknown or lost already).
  uint32_t on_lost(uint32_t id);

  /// The serving server nodes and the worker slots of serving nodes not taken by the job.
  capacity free() const;
  /// The running job, which may hold at most `workers` workers, placed `placed[node]` of
  /// them on each node.
  void job_started(uint32_t workers, const std::map<uint32_t, uint32_t>& placed);
  /// How many of the job's workers to start on node `id` (one that joined while it runs,
  /// or live when others were lost): its free slots, up to what the job may still hold; 0
  /// until it serves.
  uint32_t to_start_on(uint32_t id) const;
  /// `n` more of the job's workers run on node `id` (started there; an add-worker request).
  void placed(uint32_t id, uint32_t n);
  /// `n` of the job's workers on node `id` ended (a start that failed, a worker removed).
  void ended(uint32_t id, uint32_t n);
  void job_ended();

  /// The job's workers on live nodes.
  uint32_t job_workers() const;
  uint32_t live_nodes() const;
  const membership_limits& limits() const { return limits_; }

private:
  struct node {
    bool live = true;
    bool confirmed = false;
    bool server = false;
    uint32_t slots = 0;
    uint32_t job_workers = 0;
    std::string connection;
  };
  membership_limits limits_;
  std::map<uint32_t, node> nodes_;
  uint32_t job_size_ = 0; // the running job's workers (0: none runs)
};

}  // namespace ashlar::control
