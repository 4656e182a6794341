// Admits accepted connections on one thread: TLS and the token gate (handshake.hpp) for
// every connection a listener accepted, each within a deadline for the whole handshake,
// at most `max_pending` at once (beyond, the oldest of the source address with the most is
// dropped, so a flood from one address pushes out only its own). An unauthenticated peer
// holds no thread and a few hundred bytes at most; refusals are logged, rate-limited.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/net/handshake.hpp"

namespace ashlar::net {

class admitter {
public:
  struct admitted {
    int fd = -1;
    SSL* ssl = nullptr;   // owned by the receiver; null without TLS
    std::string peer;     // host:port
    std::string peer_name; // certificate name ("" without TLS)
    std::string token;    // the token the peer proved
    bool sealed = false;  // without TLS: sealed records under `keys` (records.hpp)
    session_keys keys;
    std::shared_ptr<void> hold; // counts toward its source's open connections while held
  };
  /// Called on the admitter's thread once a connection is admitted.
  using on_admitted = std::function<void(admitted)>;
  /// The tokens a peer may prove, read when its handshake starts (default: sec.token).
  using tokens_fn = std::function<std::vector<std::string>()>;

  /// `what` names the listener in logs ("network", "data plane").
  admitter(net_security sec, std::string what, tokens_fn tokens = {});
  ~admitter();
  admitter(const admitter&) = delete;
  admitter& operator=(const admitter&) = delete;

  /// Takes `fd` (made non-blocking here) and admits it or closes it; `done` runs if
  /// admitted. False if stopped (the caller closes fd).
  bool admit(int fd, on_admitted done);

  /// Runs `tick` on the admitter's thread at least once a second (replacing any before).
  void on_tick(std::function<void()> tick);

  /// Closes every connection being admitted and joins the thread. Idempotent.
  void stop();

  const net_security& security() const;

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

/// "host:port" of the peer of a connected socket.
std::string peer_address(int fd);

}  // namespace ashlar::net
