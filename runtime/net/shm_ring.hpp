// A byte stream between two processes of one host through shared memory: a ring in a
// memfd segment, one writer and one reader, for the data plane's co-located peers (issue
// 54: the same frames as over TCP, at the speed of memory).
//
// The segment is a header (magic, capacity, the written and read positions as 64-bit
// counters, futex words, a closed flag) followed by `capacity` bytes. The writer copies
// into free space and moves `written` on; the reader copies out and moves `read` on; each
// waits on a futex (shared, not private: the two are different processes) when the ring is
// empty or full, and wakes the other only when it waits. The peer shares the memory, so
// nothing in the header is trusted: positions that make no sense, a capacity other than
// the mapping's, a wrong magic end the stream with an error naming the ring, never an
// access outside the mapping; bytes are copied out before anyone decodes them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <sys/uio.h>

#include "runtime/core/error.hpp"

namespace ashlar::net {

class shm_ring {
public:
  shm_ring() = default;
  ~shm_ring();
  shm_ring(shm_ring&& other) noexcept;
  shm_ring& operator=(shm_ring&& other) noexcept;
  shm_ring(const shm_ring&) = delete;
  shm_ring& operator=(const shm_ring&) = delete;

  /// A new ring of `capacity` bytes (rounded up to a page) in a memfd named `name`
  /// (mode 0600, close-on-exec, its size sealed). Fails with io_error naming the call.
  [[nodiscard]] static expected<shm_ring> create(size_t capacity, const std::string& name);
  /// Maps the ring of a segment another process made (fd is duplicated; the caller keeps
  /// its own). Fails with malformed_message if the segment is not a ring of its size.
  [[nodiscard]] static expected<shm_ring> attach(int fd, const std::string& name);

  bool valid() const { return base_ != nullptr; }
  /// The segment's descriptor, to pass to the peer (SCM_RIGHTS).
  int fd() const { return fd_; }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

  /// Writes every byte of the buffers, waiting for room as the reader frees it. Fails
  /// with peer_unreachable once the ring is closed, or when no room came within
  /// `patience` (the reader is gone or stuck).
  [[nodiscard]] caf::error write_all(const iovec* iov, int count,
                                     std::chrono::milliseconds patience = std::chrono::seconds(60));
  /// Reads exactly n bytes, waiting for them. Fails with peer_unreachable once the ring
  /// is closed and empty, or when nothing came within `patience`; with malformed_message
  /// when the header no longer makes sense.
  [[nodiscard]] caf::error read_exact(void* buf, size_t n,
                                      std::chrono::milliseconds patience = std::chrono::hours(24 * 365));

  /// Marks the ring closed and wakes both ends (either end may call it, any thread).
  void close();
  /// Whether either end closed the ring (true when not open).
  bool closed() const;

  /// Reader side: one more piece the writer lent by reference (shm_channel) was copied.
  void mark_fetched();
  /// Writer side: waits until the reader has copied `count` lent pieces in all (the
  /// writer's buffers may then change). Fails as write_all does.
  [[nodiscard]] caf::error await_fetched(uint64_t count,
                                         std::chrono::milliseconds patience = std::chrono::hours(24 * 365));
  /// Writer side: lent pieces the reader has copied in all, now (0 when not open).
  uint64_t fetched() const;

  /// Leases: buffers the writer shares for the reader to read in place (shm_channel). A
  /// writer hands slot `s` out with a generation; the reader, once done with the buffer,
  /// stores that generation in the slot's word, which the writer checks without waiting.
  static constexpr uint32_t lease_slots = 256;
  /// Writer side: the generation the reader last let go of in `slot` (0 when not open).
  uint32_t released(uint32_t slot) const;
  /// Writer side: whether the reader let go of `slot`'s generation `gen`, asked at any
  /// time (it keeps this ring's mapping alive).
  std::function<bool()> released_check(uint32_t slot, uint32_t gen) const;
  /// Reader side: what lets go of `slot`'s buffer of generation `gen`, from any thread and
  /// at any time (it keeps this ring's mapping alive, so the ring may close meanwhile).
  std::function<void()> releaser(uint32_t slot, uint32_t gen) const;

  /// Called about once a second while this end waits (for bytes, room or a fetch): an
  /// error it returns ends the wait with that error (the caller's way to notice a peer
  /// that died without closing the ring, or a deadline).
  void watch(std::function<caf::error()> check) { watch_ = std::move(check); }

private:
  struct header;
  header* head() const { return reinterpret_cast<header*>(base_); }
  uint8_t* data() const;
  /// The piece the two ends hand over at once: a quarter of the ring.
  size_t hand_over() const { return capacity_ / 4; }
  caf::error broken(const std::string& why) const;
  // The common part of every wait: closed, out of patience, or the watch's error.
  caf::error still_waiting(std::chrono::steady_clock::time_point since, std::chrono::milliseconds patience,
                           const char* what);

  int fd_ = -1;
  std::shared_ptr<void> map_; // unmapped when the ring and every releaser are gone
  void* base_ = nullptr;
  size_t mapped_ = 0;
  size_t capacity_ = 0;
  std::string name_;
  std::function<caf::error()> watch_;
  std::chrono::steady_clock::time_point watched_{};
};

}  // namespace ashlar::net
