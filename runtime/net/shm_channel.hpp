// The data plane between two processes of one host: frames through a pair of shared-memory
// rings (shm_ring.hpp) instead of TCP, with every large buffer copied once, straight from
// the writer's memory into the reader's (process_vm_readv), instead of twice through the
// ring.
//
// Each buffer a writer hands over becomes a piece in the ring: a 16-byte head {length, lent
// flag, address}, then, for a small buffer, its bytes. A buffer of lend_threshold bytes or
// more is lent instead: only its address travels, the reader copies it out of the writer's
// memory, and the writer waits until it has (so the buffer may change once write_all
// returns, as with TCP). The reader copies only into the buffers it asked to fill, from
// the one process it proved is the peer: a lying head makes a malformed frame, never a
// write outside the reader's buffers.
//
// The switch from TCP happens after the admitted handshake, on the sealed connection,
// where nothing can be forged (shm_switch_client / shm_switch_server below):
//   1. the client names an abstract Unix-domain socket it listens on, in its hello;
//   2. the server makes the two rings (memfd, mode 0600, size sealed), passes them to that
//      socket with SCM_RIGHTS (the kernel names the receiver's process: SO_PEERCRED), writes
//      a random nonce and the address of a copy of it into its ring, and sends the nonce
//      over TCP;
//   3. the client checks that the rings it received carry that nonce, and that it can read
//      the server's copy of it from the server's memory, then writes the nonce and the
//      address of its own copy into its ring and answers "shm" over TCP;
//   4. the server checks the same the other way and answers "shm".
// Any step that fails leaves both on TCP, saying why. A peer on another host cannot reach
// the socket (abstract names are per network namespace, and a name is random); a process
// of another job or user that reaches it has no nonce; a peer whose memory this process may
// not read (another user, a ptrace policy, a seccomp filter) stays on TCP.
//
// After the switch the TCP connection carries nothing and is watched: its end (the peer
// exited, was killed, or closed) ends the channel within about a second.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "runtime/net/byte_channel.hpp"
#include "runtime/net/shm_arena.hpp"
#include "runtime/net/shm_ring.hpp"

namespace ashlar::net {

class tcp_socket;

class shm_channel final : public byte_channel {
public:
  /// Buffers of this many bytes or more are lent, not copied into the ring. 16 KiB.
  static constexpr size_t lend_threshold = size_t{16} << 10;
  /// Each ring's size: room for small pieces only. 64 KiB.
  static constexpr size_t ring_bytes = size_t{64} << 10;

  /// `tx`: the ring this end writes, `rx`: the one it reads; `peer_pid`: the process lent
  /// buffers are read from; `liveness_fd`: the TCP connection whose end ends the channel
  /// (not owned; -1: none).
  shm_channel(shm_ring tx, shm_ring rx, int peer_pid, int liveness_fd, std::string peer);
  ~shm_channel() override;

  /// Buffers read in place (both ends of a job's connections on one host): `mine` is this
  /// process's arena for the job, which the peer has mapped if `peer_maps_mine`; `theirs`
  /// the peer's, mapped here (nullptr: not mapped). Set before the first read or write.
  void share_arenas(std::shared_ptr<shm_arena> mine, bool peer_maps_mine, std::shared_ptr<peer_arena> theirs);
  /// Writer side: moves `t` into this job's arena, where the peer reads it in place
  /// instead of copying it (the next kept write then lends it under a lease, which the
  /// peer gives back when it lets go of its view). False when it stays as it is: the peer
  /// has no mapping of the arena, or `t` is small (shm_arena::share).
  /// `version`: a shard's parameter version `t` is a window of (shm_arena::share).
  bool share(wire::shared_tensor& t, std::optional<uint64_t> version = {});
  /// This process's arena for the job (nullptr: none shared).
  const std::shared_ptr<shm_arena>& arena() const { return arena_; }
  /// Leases the peer holds now (buffers it reads in place), for tests.
  size_t leased() const;
  /// Whether this end reads the peer's shared tensors in place, and the peer this end's.
  bool reads_in_place() const { return peer_arena_ != nullptr; }
  bool peer_reads_in_place() const { return peer_maps_arena_; }

  [[nodiscard]] caf::error read_exact(void* buf, size_t n) override;
  [[nodiscard]] std::shared_ptr<const void> read_view(size_t n) override;
  [[nodiscard]] caf::error write_all(iovec* iov, int count) override;
  void set_read_deadline(std::optional<std::chrono::steady_clock::time_point> deadline) override;
  const std::string& peer() const override { return peer_; }

  /// Ends both directions (either end, any thread): waiting reads and writes fail.
  void close();

  /// The next write_all does not wait for the reader to copy its lent buffers: `owner`
  /// keeps them alive until it has (it is let go once the reader has fetched them, at a
  /// later write or release_fetched, or after the channel is closed). In such a write the
  /// first two buffers (a frame's header and its message's fields, the writer's own
  /// scratch) always go through the ring, and the later ones (the tensors `owner` holds)
  /// are lent from kept_lend_threshold bytes on, so that a frame puts a few hundred bytes
  /// at most into the ring: with the data plane's bound on the requests a connection has
  /// unanswered, a write then finds room even while the reader is stopped, and an actor
  /// may write on its own thread without waiting for the peer. A write that fails closes
  /// the channel before it lets go of anything it lent.
  void lend_until_fetched(std::shared_ptr<void> owner) { owner_ = std::move(owner); }
  static constexpr size_t kept_lend_threshold = 256;
  /// Writer side: what writes keep for the reader now (their owners).
  size_t kept() const { return kept_.size(); }
  /// Writer side: lets go of what the reader has copied by now (each write does too). Call
  /// where the writes are made, or under their lock: a reply just read shows the peer has
  /// the request's buffers.
  void release_fetched();

private:
  struct kept_write {
    uint64_t fetched_at = 0;                          // lent pieces copied by then
    std::vector<std::pair<uint32_t, uint32_t>> leases; // (slot, generation) still held by the peer
    std::shared_ptr<void> owner;
  };
  caf::error watch(bool reading);
  // The head of the next piece, read if none is being read; false at an error.
  caf::error next_piece();
  // Reader side: the piece being read was consumed whole.
  void piece_done();
  // Reader side, once closed: gives back the leases of pieces it will never read.
  void give_back_unread();
  // Writer side: `owner` stays (in the arena's keeping) until the peer gives back the
  // lease (slot, gen) or its process ends.
  void hold(uint32_t slot, uint32_t gen, const std::shared_ptr<void>& owner);

  shm_ring tx_, rx_;
  int peer_pid_;
  int peer_pidfd_ = -1; // (pidfd_open: -1 where the kernel has none)
  int liveness_fd_;
  std::string peer_;
  std::atomic<int64_t> deadline_ns_{0}; // 0: none
  // Writer side: pieces lent in all. Reader side: the piece being read.
  uint64_t lent_ = 0;
  std::shared_ptr<void> owner_; // for the next write (lend_until_fetched)
  std::deque<kept_write> kept_;
  std::shared_ptr<shm_arena> arena_;     // this process's, for the job
  bool peer_maps_arena_ = false;
  std::shared_ptr<peer_arena> peer_arena_; // the peer's, mapped here
  std::vector<uint32_t> free_slots_;       // writer side: leases not handed out
  std::vector<uint32_t> generation_;       // writer side: each slot's last generation
  uint64_t piece_left_ = 0;
  uint64_t piece_addr_ = 0;
  bool piece_lent_ = false;
  bool piece_leased_ = false; // in the writer's arena, under a lease
  uint32_t piece_slot_ = 0, piece_gen_ = 0;
  caf::error pending_error_; // met by read_view, returned by the next read_exact
};

/// Client side, before the hello: an abstract Unix-domain socket with a random name to
/// receive the rings on.
struct shm_offer {
  int fd = -1;
  std::string name; // without the leading NUL
  shm_offer() = default;
  shm_offer(shm_offer&& o) noexcept;
  shm_offer& operator=(shm_offer&& o) noexcept;
  ~shm_offer();
};
[[nodiscard]] expected<shm_offer> offer_shm();

/// What the hello carries after "<protocol> <shard>": " shm=<name>".
std::string shm_hello_part(const shm_offer& offer);
/// The offered name in a hello's text, if any (checked: hex only).
std::optional<std::string> shm_name_in_hello(const std::string& hello);

/// Server side, once it accepted the hello: makes the rings, passes them, proves itself.
/// Returns the text of its welcome ("shm <nonce>") and keeps what it needs in `pending`;
/// on failure (the client is not on this host, ...) an error saying why: the welcome is
/// then "tcp <why>".
struct shm_pending {
  std::optional<shm_ring> c2s, s2c;
  int peer_pid = 0;
  std::string nonce; // its bytes are read from this process by the peer: keep it put
  std::shared_ptr<shm_arena> arena; // this process's for the job (nullptr: none offered)
  bool peer_maps_arena = false;
};
/// `arena`: this process's arena for the connection's job, offered to the peer (nullptr:
/// none, tensors are copied across).
[[nodiscard]] expected<std::string> shm_server_offer(const std::string& name, shm_pending& pending,
                                                     std::chrono::milliseconds timeout,
                                                     std::shared_ptr<shm_arena> arena = nullptr);

/// Client side, after a welcome: the whole switch (steps 3 and 4) over `sock`. Returns
/// the channel, or nothing when the path stays TCP, with `why` saying why; fails only
/// when the TCP connection itself failed.
[[nodiscard]] expected<std::unique_ptr<shm_channel>> shm_switch_client(tcp_socket& sock, shm_offer& offer,
                                                                        const std::string& welcome,
                                                                        std::chrono::milliseconds timeout,
                                                                        std::string& why,
                                                                        std::shared_ptr<shm_arena> arena = nullptr);
/// Server side, after it sent its welcome: step 4. Same results.
[[nodiscard]] expected<std::unique_ptr<shm_channel>> shm_switch_server(tcp_socket& sock, shm_pending& pending,
                                                                        std::chrono::milliseconds timeout,
                                                                        std::string& why);

/// Copies n bytes at `addr` in process `pid` into buf (process_vm_readv).
[[nodiscard]] caf::error read_peer_memory(int pid, uint64_t addr, void* buf, size_t n);

}  // namespace ashlar::net
