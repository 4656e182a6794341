// What the data plane's frames (tensor_frames.hpp) travel over: a byte stream in each
// direction, one reading thread and one writing thread. A TCP socket (socket.hpp) or, for
// a peer on the same host, a pair of shared-memory rings (shm_channel.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include <sys/uio.h>

#include "runtime/core/error.hpp"

namespace ashlar::net {

class byte_channel {
public:
  virtual ~byte_channel() = default;

  /// Reads exactly n bytes. Fails with peer_unreachable when the peer is gone or the
  /// read deadline passed.
  [[nodiscard]] virtual caf::error read_exact(void* buf, size_t n) = 0;
  /// If the next n bytes are one buffer the peer shares in place (shared memory), a
  /// read-only view of them, valid while held, instead of a copy; nullptr otherwise (read
  /// them with read_exact).
  virtual std::shared_ptr<const void> read_view(size_t n) {
    (void)n;
    return nullptr;
  }
  /// Writes every byte of the buffers, in order; they may change once it returns.
  [[nodiscard]] virtual caf::error write_all(iovec* iov, int count) = 0;
  /// Reads must be done by `deadline`, however the bytes trickle in; nullopt: none.
  virtual void set_read_deadline(std::optional<std::chrono::steady_clock::time_point> deadline) = 0;
  /// Who is at the other end, for messages.
  virtual const std::string& peer() const = 0;
};

}  // namespace ashlar::net
