// The scheduler's own check that each node still answers, beside the transport's. A node
// whose process dies is normally seen at once (its connection closes) or within the
// heartbeat timeout (a frozen one); but a node killed while the transport still set its
// connection up can be left counted as live, holding its workers in every round of a
// lockstep job. So the scheduler pings every live node, and one that answers no ping for
// `timeout` is lost as if its connection had closed. Pure, on a clock_source.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/core/clock.hpp"

namespace ashlar::control {

struct watch_timing {
  /// How often each live node is pinged. Default: 2 s.
  uint64_t interval_ns = 2000000000ull;
  /// How long a node may go without answering before it is lost. Default: 20 s: far
  /// past the transport's own heartbeat timeout (a backstop, not the first detector),
  /// and long enough for an answer from a node whose cores a large job saturates.
  uint64_t timeout_ns = 20000000000ull;
};

class node_watch {
public:
  explicit node_watch(const clock_source& clock, watch_timing timing = {}) : clock_(clock), timing_(timing) {}

  /// Node `id` joined: it counts as having answered now.
  void watch(uint32_t id);
  /// Node `id` was lost or left: no more pings.
  void forget(uint32_t id) { nodes_.erase(id); }
  /// Node `id` answered a ping.
  void answered(uint32_t id);
  /// The nodes to ping now: each at most once per interval.
  std::vector<uint32_t> to_ping();
  /// The nodes that answered nothing for the timeout, forgotten here: the caller loses them.
  std::vector<uint32_t> silent();

  const watch_timing& timing() const { return timing_; }
  size_t watched() const { return nodes_.size(); }

private:
  struct seen {
    uint64_t answered_ns = 0;
    uint64_t pinged_ns = 0;
  };
  const clock_source& clock_;
  watch_timing timing_;
  std::map<uint32_t, seen> nodes_;
};

}  // namespace ashlar::control
