// Blocking TCP sockets for the tensor data plane: connect with a timeout, listen, and
// whole-buffer reads and writes. Plain POSIX; errors name the peer address.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <sys/uio.h>

#include "runtime/core/error.hpp"
#include "runtime/net/byte_channel.hpp"

namespace ashlar::net {

/// One connected TCP socket. Owns its descriptor (closed on destruction). shutdown() may
/// be called from any thread to wake a thread blocked in read or write on it.
class tcp_socket final : public byte_channel {
public:
  tcp_socket() = default;
  tcp_socket(int fd, std::string peer);
  ~tcp_socket() override;
  tcp_socket(tcp_socket&& other) noexcept;
  tcp_socket& operator=(tcp_socket&& other) noexcept;
  tcp_socket(const tcp_socket&) = delete;
  tcp_socket& operator=(const tcp_socket&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  /// "host:port" of the other end, for messages.
  const std::string& peer() const override { return peer_; }

  /// Reads exactly n bytes. Fails with peer_unreachable when the peer closes or the
  /// connection breaks (or the timeout set by set_timeout passes).
  [[nodiscard]] caf::error read_exact(void* buf, size_t n) override;

  /// Writes every byte of the buffers, in order.
  [[nodiscard]] caf::error write_all(iovec* iov, int count) override;

  /// Read and write timeout; zero: none (block until data or error).
  [[nodiscard]] caf::error set_timeout(std::chrono::milliseconds t);

  /// Reads must be done by `deadline` (a read still waiting then fails with
  /// peer_unreachable, saying so), however the bytes trickle in; std::nullopt: no
  /// deadline (the timeout of set_timeout still applies to each wait).
  void set_read_deadline(std::optional<std::chrono::steady_clock::time_point> deadline) override {
    deadline_ = deadline;
  }

  /// Ends both directions; blocked reads and writes return an error. Idempotent.
  void shutdown();

  /// From now on every byte is sealed with AES-128-GCM (the first 16 bytes of each key,
  /// as TLS's own default suite): writes in records of at most 256 KiB, each buffer
  /// of a write starting a record of its own, under `tx_key`; reads under `rx_key`
  /// (records of at most 1 MiB; a record that fails authentication
  /// fails the read). Reads and writes may then still run on two threads.
  void seal(const uint8_t (&tx_key)[32], const uint8_t (&rx_key)[32]);
  bool sealed() const { return aead_ != nullptr; }
  /// Bytes of record buffers the connection keeps between reads and writes.
  size_t record_buffer_bytes() const;

  /// Gives up the descriptor (the socket no longer closes it).
  int release();

  struct aead;

private:
  caf::error read_raw(void* buf, size_t n);
  caf::error write_raw(iovec* iov, int count);

  int fd_ = -1;
  std::string peer_;
  std::atomic<bool> shut_{false};
  std::shared_ptr<aead> aead_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
};

/// Connects to host:port, failing with peer_unreachable (naming the address) after
/// `timeout`. Sets TCP_NODELAY.
[[nodiscard]] expected<tcp_socket> connect_tcp(const std::string& host, uint16_t port,
                                               std::chrono::milliseconds timeout);

/// A listening TCP socket.
class tcp_listener {
public:
  tcp_listener() = default;
  ~tcp_listener();
  tcp_listener(tcp_listener&& other) noexcept;
  tcp_listener& operator=(tcp_listener&& other) noexcept;

  /// Listens on host:port (port 0: any free port; host "" or "0.0.0.0": every interface).
  [[nodiscard]] static expected<tcp_listener> open(const std::string& host, uint16_t port);

  uint16_t port() const { return port_; }

  /// Blocks until a peer connects or shutdown() is called (then fails with invalid_state).
  [[nodiscard]] expected<tcp_socket> accept();

  /// Wakes a thread blocked in accept(); later accepts fail. Idempotent.
  void shutdown();

private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> shut_{false};
};

/// The local IPv4 address this host uses to reach host:port (no packet is sent), or ""
/// if there is no route.
std::string local_address_toward(const std::string& host, uint16_t port);

}  // namespace ashlar::net
