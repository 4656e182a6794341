// What the cluster does when a node it asked to serve a lost shard again (from the shard's
// checkpoint store) did not: whom it asks next, and when. The cluster actor names the
// failure and routes the answer.
#pragma once

#include <chrono>

#include "runtime/wire/messages.hpp"

namespace ashlar {

/// Why a node did not serve a lost shard.
enum class serve_failure {
  /// The shard's store is held by another process (errc::busy): its holder lets go, or
  /// its lease goes stale and the store is taken over (store_lease.hpp).
  busy,
  /// The node had not answered within the request's time: it may still be restoring a
  /// large store. It works on one request at a time, so a request sent now waits behind
  /// that restore, and a node answers a request for a shard it already serves for the
  /// same job with that shard (same_shard_of_job).
  timed_out,
  /// Any other answer: the node cannot serve it (no server role, a store it cannot read).
  refused,
};

/// Whom the cluster asks next, after how long.
struct serve_retry {
  enum target_t {
    nobody,    ///< the shard stays lost until a server node joins (the job's run.shard_wait bounds the wait)
    same_node, ///< the node that did not answer
    any_node,  ///< the server node that joined last, as for a newly lost shard
  };
  target_t target = nobody;
  std::chrono::milliseconds after{0};
};

/// The cluster's next step after `why`, where `node_alive` says whether the node asked is
/// still in the cluster. A node gone meanwhile: any node, after 0.5 s. A busy store: any
/// node, after 2 s (a takeover needs the lease unchanged across tries). No answer in time:
/// the same node, at once. A refusal: nobody.
serve_retry after_failed_serve(serve_failure why, bool node_alive);

/// Whether two requests ask for the same shard of the same job: the same job id and every
/// other field equal but the initial parameters and `resume` (a request to serve a lost
/// shard again is the job's request for it, resuming). A node asked again for a shard it
/// already serves from the same store answers with that shard. The job id tells two jobs
/// with the same settings apart (a job resumed from the store of one whose shard still
/// stops); requests without one (an older scheduler's) compare by their settings alone.
bool same_shard_of_job(const wire::spawn_shard& a, const wire::spawn_shard& b);

}  // namespace ashlar
