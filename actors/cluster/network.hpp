// Ashlar's transport under CAF's network layer: every connection to a node is admitted
// before CAF's BASP protocol reads a byte from it, and bounded afterwards.
//
//  - Admission (runtime/net/handshake.hpp): mutual TLS when the process has credentials,
//    then the token gate (HMAC challenge-response: the token never crosses the wire).
//    A listening node admits on its own thread, with a deadline for the whole handshake
//    and a cap on connections being admitted (the oldest is dropped beyond it), so an
//    unauthenticated peer can hold neither a thread nor more than a few hundred bytes,
//    and never reaches the network thread.
//  - After admission, every BASP header an admitted peer sends is checked before CAF
//    allocates its payload: a message over `max_message` closes the connection.
//
// CAF's own middleman actor stays, unused; publish and connect go through this one.
#pragma once

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "actors/cluster/system.hpp"
#include "runtime/net/handshake.hpp"

namespace ashlar::actors {

class cluster_network {
public:
  /// Sets up the transport for `sys` (one per actor system). The returned pointer is the
  /// only owner: dropping it (or stop()) stops the transport, which must happen before
  /// the actor system is destroyed.
  [[nodiscard]] static expected<std::shared_ptr<cluster_network>> start(caf::actor_system& sys,
                                                                         net::net_security sec);
  ~cluster_network();
  cluster_network(const cluster_network&) = delete;
  cluster_network& operator=(const cluster_network&) = delete;

  /// Makes `whom` reachable at `where` (port 0: any free port); returns the port.
  template <class Handle>
  [[nodiscard]] expected<uint16_t> publish(caf::actor_system& sys, const Handle& whom, const endpoint& where) {
    return publish_ptr(caf::actor_cast<caf::strong_actor_ptr>(whom), sys.message_types(whom), where);
  }
  [[nodiscard]] expected<uint16_t> publish_ptr(caf::strong_actor_ptr whom, std::set<std::string> sigs,
                                               const endpoint& where);

  /// The middleman actor to send (connect_atom, host, port) to.
  const caf::actor& handle() const;

  const net::net_security& security() const;

  /// Stops admitting, closes connections being admitted, and stops the middleman actor.
  /// Idempotent.
  void stop();

  struct impl;

private:
  explicit cluster_network(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// The transport set up for `sys`, or null.
std::shared_ptr<cluster_network> network_of(caf::actor_system& sys);

}  // namespace ashlar::actors
