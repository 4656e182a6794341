// Drives one connection's admission over a socket: TLS (when the process has
// credentials), then the token gate of gate.hpp. Non-blocking: step() goes as far as the
// socket allows, and events() says what to wait for, so one thread can admit many
// connections (the server side) or one caller can wait on a deadline (the client side).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/net/gate.hpp"
#include "runtime/net/tls.hpp"

namespace ashlar::net {

/// What a process brings to its connections.
struct net_security {
  /// The cluster token (empty: none; then TLS alone admits, or anyone on loopback).
  std::string token;
  /// Node credentials; null: no TLS.
  std::shared_ptr<tls_context> tls;
  /// Largest message an admitted peer may announce. Default: 256 MiB.
  uint64_t max_message = uint64_t{256} << 20;
  /// The bytes of messages over 2 MiB the process receives at once, over all its
  /// connections (a connection whose announcement would pass it is closed). Default: 1 GiB.
  uint64_t max_in_flight = uint64_t{1} << 30;
  /// A connection must finish TLS and the gate within this time. Default: 5 s.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Connections a node admits at once (beyond, the oldest of the source with the most is
  /// dropped). Default: 64.
  size_t max_pending = 64;
  /// Connections open at once from one source address, admitted or being admitted; a
  /// connection beyond is refused before its handshake. Default: 512.
  size_t max_per_source = 512;
  /// Sealed records after the gate on connections without TLS (records.hpp). Only the
  /// wire bench turns it off, on both ends, to measure what sealing costs.
  bool seal_records = true;
};

class handshake {
public:
  enum class result { pending, admitted, refused };

  /// `fd` must be non-blocking; the handshake does not own it. A server admits a peer
  /// proving sec.token, or any of `tokens` when given.
  handshake(int fd, bool server, const net_security& sec, std::vector<std::string> tokens = {});
  ~handshake();
  handshake(const handshake&) = delete;
  handshake& operator=(const handshake&) = delete;

  /// Goes on as far as the socket allows without blocking.
  result step();
  /// POLLIN and/or POLLOUT: what step() waits for.
  short events() const { return events_; }
  /// Why the connection was refused (names the peer's fault, for a log or the user).
  const std::string& why() const { return why_; }
  /// The TLS session (null without TLS); the caller owns it afterwards.
  SSL* release_ssl();
  /// The peer's certificate name ("" without TLS).
  const std::string& peer_name() const { return peer_name_; }
  int fd() const { return fd_; }
  /// Client side: what the server answered (wrong_token when it refused the token).
  gate_status status() const { return client_gate_ ? client_gate_->status() : gate_status::ok; }
  /// Whether what follows goes in sealed records (records.hpp): on every admitted
  /// connection without TLS (a TLS session protects the others).
  bool sealed() const { return seal_ && ssl_ == nullptr && !had_tls_; }
  /// The record keys (once admitted).
  session_keys keys() const { return server_gate_ ? server_gate_->keys() : client_gate_->keys(); }
  /// Server side: the token the admitted peer proved.
  std::string matched() const { return server_gate_ ? server_gate_->matched() : std::string{}; }
  /// Ends the handshake as refused (its deadline passed).
  result expire(std::string why) { return fail(std::move(why)); }

private:
  result fail(std::string why);
  // Sends out_; false if the socket cannot take it all now (or failed: state set).
  bool flush();

  int fd_;
  bool server_;
  SSL* ssl_ = nullptr;
  bool sniffed_ = false;
  bool had_tls_ = false;
  bool seal_ = true;
  bool tls_done_ = false;
  std::optional<gate_server> server_gate_;
  std::optional<gate_client> client_gate_;
  std::vector<uint8_t> out_;
  short events_ = 0;
  bool refused_ = false;
  std::string why_;
  std::string peer_name_;
};

/// Runs `h` to the end, waiting on its socket, for at most `timeout`.
handshake::result run_handshake(handshake& h, std::chrono::milliseconds timeout);

/// Reads and writes an admitted connection: plain, or through its TLS session.
struct tls_io {
  /// Bytes read (> 0), 0 if none now (would block), -1 on end of stream or error.
  static long read_some(SSL* ssl, int fd, void* buf, size_t len);
  static long write_some(SSL* ssl, int fd, const void* buf, size_t len);
};

}  // namespace ashlar::net
