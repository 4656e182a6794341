// Setting up an actor_system that talks to other nodes: message types, the middleman with
// heartbeats, endpoints, and connecting with a timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "actors/interfaces.hpp"

namespace ashlar::actors {

/// A host and port, parsed from "HOST:PORT".
struct endpoint {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

/// Parses "HOST:PORT" (port 0 allowed: pick a free one). Fails with invalid_argument
/// naming the text.
[[nodiscard]] expected<endpoint> parse_endpoint(const std::string& text);

/// CAF's heartbeats between nodes: every `heartbeat_interval` a node checks its
/// connections, and drops one silent for `connection_timeout`.
inline constexpr std::chrono::seconds heartbeat_interval{1};
inline constexpr std::chrono::seconds connection_timeout{3};

/// An actor_system_config with Ashlar's message types, CAF's network layer, and
/// heartbeats (interval 1 s, connection timeout 3 s): a killed or frozen peer is noticed
/// within about 4 s.
class cluster_system_config : public caf::actor_system_config {
public:
  cluster_system_config();
};

/// What a connection to a port nobody listens on fails with, in its error's text.
inline constexpr const char* connection_refused = "connection refused: nothing listens there";

/// Connects to the actor published at `where`, retrying refused connections until
/// `timeout` has passed (a node may start before its scheduler), or for `refused_for` (0: as long) where
/// nothing listens (a client at a dead port hears so at once). Never blocks longer than
/// `timeout`, even against a peer that accepts but never answers. Fails with
/// peer_unreachable naming the address and why, in words.
[[nodiscard]] expected<caf::strong_actor_ptr> connect(caf::actor_system& sys, const endpoint& where,
                                                      std::chrono::milliseconds timeout,
                                                      std::chrono::milliseconds refused_for =
                                                        std::chrono::milliseconds(0));

/// Whether the node at `where` admits a connection now: a TCP connection and the
/// admission handshake (TLS, token) with this system's security, nothing of CAF's, closed
/// at once. None when admitted; handshake_refused when it refused the token;
/// peer_unreachable when it cannot be reached, drops the connection or does not answer
/// within `timeout` (a frozen process's kernel accepts TCP connections it never answers).
[[nodiscard]] caf::error probe_admission(caf::actor_system& sys, const endpoint& where,
                                         std::chrono::milliseconds timeout);

/// The cluster token: the first line of `file` when given, else $ASHLAR_TOKEN through
/// `env_token` (may be null), else empty (no authentication).
[[nodiscard]] expected<std::string> load_token(const std::string& file, const char* env_token);

}  // namespace ashlar::actors
