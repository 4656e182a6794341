// Buffers a process shares with the co-located peers of one job: a sparse memfd segment
// (mode 0600, its size sealed) that the peers of shared-memory data connections of that
// job map read-only, so that a tensor lying in it crosses to them with no copy at all:
// they read it where it lies (shm_channel's leases) instead of copying it out of this
// process's memory.
//
// One arena per job and process (a node process serving two jobs has two; a peer is
// offered only the arena of the job whose key it proved. The peer takes it with
// pidfd_getfd, which needs the permission to read this process's memory, which the
// data plane's copies between processes (process_vm_readv) need too: a process of the same
// user that may read this one's memory can read any of its buffers either way). Buffers are
// whole pages, handed out from a bump pointer and reused by size once let go; let-go pages
// beyond `resident_cache` (or two of the largest buffers) are given back to the system
// (the range stays reserved), so what the arena holds resident follows what is in flight.
// A buffer without resident pages gets them all at once (MADV_POPULATE_WRITE), not a fault
// per page.
//
// A shard's parameter version is shared once per arena: `share` keeps the copy it made of
// a version for the next replies of it (to the other workers of the host), for as long as
// the version's storage lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar::net {

class shm_arena : public std::enable_shared_from_this<shm_arena> {
public:
  /// The segment's size: address space only, pages come as they are written. 16 GiB.
  static constexpr size_t reserved_bytes = size_t{16} << 30;
  /// Smaller tensors are not shared (their copy costs less than a lease): 64 KiB.
  static constexpr size_t min_share_bytes = size_t{64} << 10;
  /// Pages of let-go buffers kept for reuse before they go back to the system: 64 MiB,
  /// or two of the largest buffer let go if more.
  static constexpr size_t resident_cache = size_t{64} << 20;
  /// Parameter versions `share` keeps copies of, at most.
  static constexpr size_t max_versions = 16;

  ~shm_arena();
  shm_arena(const shm_arena&) = delete;
  shm_arena& operator=(const shm_arena&) = delete;

  /// This process's arena for the job of `key`, made on the first call and kept while
  /// anything holds it (its buffers keep only their pages, not the arena). Fails with
  /// io_error naming the call (no memfd: peers then copy).
  [[nodiscard]] static expected<std::shared_ptr<shm_arena>> for_job(const std::string& key);
  /// A fresh segment not registered for any job (tests).
  [[nodiscard]] static expected<std::shared_ptr<shm_arena>> make(size_t reserved = reserved_bytes);

  /// `n` floats in the arena (page-aligned, uninitialized), let go when the last copy of
  /// the pointer goes; nullptr when the arena is full.
  std::shared_ptr<float> allocate(size_t n);

  /// `t`'s floats as a tensor in this arena: `t` itself if it lies here, else a copy.
  /// With `version` (a shard's parameter version that `t` is a window of), the copy is
  /// kept and handed out again for the same window of the same version while its storage
  /// lives (the replies of one version to every worker of the host share one copy).
  /// nullopt when `t` is smaller than min_share_bytes or the arena is full.
  std::optional<wire::shared_tensor> share(const wire::shared_tensor& t, std::optional<uint64_t> version = {});

  /// Keeps `owner` (buffers a closed connection's peer may still read in place) until
  /// `released()` says the peer let go, or the peer's process ended: `pidfd` (owned) is
  /// readable, or, without one (-1: none could be made), no process `pid` is left (a pid
  /// taken since by another process only keeps `owner` longer). Checked at every arena's
  /// allocations in this process, the arena gone or not.
  static void hold_until(std::function<bool()> released, int pidfd, int pid, std::shared_ptr<void> owner);

  /// Adds `r`, which lets go of buffers something keeps for peers that may be done with
  /// them (a connection's writes whose leases came back since it last looked); removed
  /// when the returned handle goes (not while reclaim() runs it).
  [[nodiscard]] std::shared_ptr<void> add_reclaimer(std::function<void()> r);
  /// Runs every reclaimer: before a buffer someone still references is copied instead of
  /// written in place (shard_core), the references that are only bookkeeping go.
  void reclaim();

  bool contains(const void* p, size_t bytes) const;
  int fd() const;
  uint64_t base() const;
  size_t size() const;

  /// For tests and benches: bytes handed out and not let go; bytes of let-go buffers kept
  /// resident for reuse.
  size_t bytes_in_use() const;
  size_t bytes_cached() const;

private:
  struct pages; // the segment and its buffers: what a buffer keeps alive
  shm_arena() = default;

  std::shared_ptr<pages> pages_;
  mutable std::mutex mtx_; // versions_
  struct shared_version {
    // Not held (the shard may then write its storage in place: for its next version): a
    // copy is found only for the same storage, window and version number.
    std::weak_ptr<const float> source;
    wire::shared_tensor copy;
    uint64_t used = 0; // when it was last handed out (the oldest goes first)
  };
  struct version_key {
    const float* data;
    size_t size;
    uint64_t version;
    bool operator<(const version_key& o) const {
      return std::tie(data, size, version) < std::tie(o.data, o.size, o.version);
    }
  };
  std::map<version_key, shared_version> versions_;
  uint64_t uses_ = 0;
  std::mutex reclaim_mtx_; // reclaimers_ (held while they run)
  std::map<uint64_t, std::function<void()>> reclaimers_;
  uint64_t next_reclaimer_ = 0;
};

/// A peer's arena, mapped read-only in this process; unmapped when the last view of it
/// goes.
struct peer_arena {
  const uint8_t* at = nullptr; // this process's mapping
  uint64_t base = 0;           // where the peer has it
  size_t size = 0;
  peer_arena() = default;
  peer_arena(const peer_arena&) = delete;
  peer_arena& operator=(const peer_arena&) = delete;
  ~peer_arena();
  /// Where the peer's [addr, addr + n) lies in this process, or nullptr if outside.
  const uint8_t* find(uint64_t addr, size_t n) const {
    return addr >= base && n <= size && addr - base <= size - n ? at + (addr - base) : nullptr;
  }
};

/// Process `pid` as a pidfd (readable once it ended; its pid may be another's later), or
/// -1 where the kernel has none or it is gone.
int open_pidfd(int pid);

/// Maps the arena of process `pid` that it holds as descriptor `fd`, of `size` bytes at
/// `base` there (pidfd_getfd: the same permission as reading its memory). Fails naming
/// why: not a sealed memory segment of that size, no permission, the process is gone.
[[nodiscard]] expected<std::shared_ptr<peer_arena>> map_peer_arena(int pid, int fd, uint64_t base, size_t size);

}  // namespace ashlar::net
