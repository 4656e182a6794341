// The tensor data plane: pulls and pushes between a worker and a shard in another process,
// and a ring all-reduce's chunks from a worker to the next, on a direct TCP connection
// (runtime/net/tensor_frames.hpp), while every other message keeps crossing CAF's
// middleman. Tensors then skip the middleman's serialization copies and the routing
// through the scheduler's node, and each (worker, shard) pair, or (worker, next worker),
// gets its own connection.
//
// A shard node serves its shards on one data port; a worker node connects one stand-in
// actor per remote shard. The stand-in has the shard's interface, so the worker does not
// know which path a message takes. A ring job's worker node serves its workers' ring
// inboxes on its own data port the same way, and each worker sends its chunks through a
// stand-in for the next worker on the ring.
//
// A worker on the shard node's host moves its frames through shared memory instead of
// TCP, after both ends proved they share the host over the admitted connection (the TCP
// connection then only tells when the peer is gone); large tensors are copied once,
// straight from one process's memory into the other's.
//
// A connection is admitted like a node's (runtime/net/admitter.hpp): TLS when the process
// has credentials, then proof of the job's data-plane key (the scheduler hands it out
// over the admitted CAF connections; it never crosses the data connection), within a
// deadline, on one admission thread. Only then does it get a thread of its own (at most
// 1024 per node). Frames are sealed with AES-128-GCM (runtime/net/records.hpp) under keys
// exported from the TLS session, or without TLS derived from the gate's handshake, so
// the reader thread and the writing actor need no lock. A shard node
// reads no further from a connection with 32 requests unanswered, nor past its budget for
// tensors in flight over all connections (limit_in_flight): backpressure, not refusal.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "actors/interfaces.hpp"
#include "runtime/net/tls.hpp"

namespace ashlar::actors {

/// Owns the data plane's listener, connections and their threads in one process.
class data_plane {
public:
  explicit data_plane(caf::actor_system& sys);
  ~data_plane();
  data_plane(const data_plane&) = delete;
  data_plane& operator=(const data_plane&) = delete;

  /// TLS credentials for this data plane's connections. Default: those of the process's
  /// cluster network (network.hpp), if any.
  void use_tls(std::shared_ptr<net::tls_context> tls);

  /// Whether peers on this host may switch from TCP to shared memory once both proved
  /// they share it (runtime/net/shm_channel.hpp). Default: yes. Each connection's path is
  /// logged on the worker side (info) and the shard side (debug).
  void use_shared_memory(bool allow);
  /// Open connections (either side) whose frames go through shared memory.
  size_t shared_memory_connections() const;
  /// Buffers for the tensors a worker of the job of `key` sends: this process's
  /// shared-memory arena for that job, whose buffers peers on this host read in place
  /// (runtime/net/shm_arena.hpp); empty when shared memory is off or no arena can be made.
  std::function<std::shared_ptr<float>(size_t)> tensor_buffers(const std::string& key) const;
  /// Lets go of what this process's shared-memory connections of the job of `key` keep
  /// for peers that gave it back (shard_core::use_storage); empty where tensor_buffers is.
  std::function<void()> tensor_reclaim(const std::string& key) const;

  /// Shard side: the bytes of request tensors this node reads and its shards have not yet
  /// taken (a push's tensor until the shard applied or buffered it, whether or not the
  /// push is answered yet), over all its connections (default: the process network's
  /// --max-in-flight-mb, else 1 GiB; one tensor larger than that is taken alone). A
  /// tensor past it waits, its bytes left in the peer's TCP buffers, up to
  /// net::message_deadline (grace + 1 s a MiB), and must then arrive whole within that
  /// time; else its connection is closed and named in the log. Connections admitted
  /// before a call keep the budget they had.
  void limit_in_flight(uint64_t total, std::chrono::milliseconds grace = std::chrono::seconds(30));
  /// Shard side: the bytes of that budget taken now.
  uint64_t in_flight_bytes() const;

  /// Listens on `host` (any free port) once; later calls return the same endpoint.
  /// Returns the endpoint "host:port" to advertise.
  [[nodiscard]] expected<std::string> listen(const std::string& host);

  /// Ring side: makes `inbox` (a worker of the job whose data-plane key is `key`) reachable
  /// for its previous worker on the ring, who connects with connect_ring: the chunks that
  /// come (each at most `max_payload` bytes) are sent to it as wire::ring_message. Needs
  /// listen(). Until unserve_ring; a connection made before goes on until it ends.
  void serve_ring(const caf::actor& inbox, const std::string& key, uint64_t max_payload);
  void unserve_ring(caf::actor_id inbox);

  /// Shard side: makes `shard` reachable for clients presenting `key`. The first call
  /// listens on `host` (any free port). Returns the endpoint "host:port" to advertise.
  /// `range_floats` (the shard's range; 0: not known) bounds the tensor a request may
  /// carry: a larger one closes the connection before anything is allocated for it.
  [[nodiscard]] expected<std::string> serve(uint32_t shard_id, const shard_actor& shard,
                                            const std::string& key, const std::string& host,
                                            uint64_t range_floats = 0);

  /// Worker side: connects to a shard's data endpoint and returns a local stand-in for
  /// `remote`: pulls and pushes go over the connection, everything else to `remote` over
  /// CAF. It quits with remote's exit reason when remote goes down, and when `owner`
  /// goes down. If the connection breaks later, requests in flight fail with
  /// peer_unreachable and later ones go over CAF. Blocks up to `timeout` (connect and
  /// handshake, each try at most 5 s; a node too busy admitting others to answer is tried
  /// again after a random backoff); fails with peer_unreachable or handshake_refused,
  /// naming the endpoint.
  [[nodiscard]] expected<shard_actor> connect(const shard_actor& remote, uint32_t shard_id,
                                              const std::string& endpoint, const std::string& key,
                                              const caf::actor& owner,
                                              std::chrono::milliseconds timeout);

  /// Worker side: connects to the data plane at `endpoint` that serves `next`'s ring inbox
  /// and returns a stand-in for `next`: the ring messages sent to it go over the
  /// connection, in order (after the connection broke, to `next` over CAF). It quits when
  /// `next` or `owner` goes down. Blocks and fails as connect() does.
  [[nodiscard]] expected<caf::actor> connect_ring(const caf::actor& next, const std::string& endpoint,
                                                  const std::string& key, const caf::actor& owner,
                                                  std::chrono::milliseconds timeout);

  /// Closes the listener and every connection and joins their threads. Call before the
  /// actor system is destroyed; also done by the destructor. Idempotent.
  void stop();

  struct impl;

private:
  std::shared_ptr<impl> impl_;
};

/// A random key for one job's data plane (hex, 128 bits, OpenSSL's CSPRNG).
std::string make_data_key();

}  // namespace ashlar::actors
