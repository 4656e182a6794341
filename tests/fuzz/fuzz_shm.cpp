// libFuzzer harness: the shared-memory channel's pieces (runtime/net/shm_channel.hpp) as a
// hostile peer would write them into the ring (heads of any length, lent buffers at any
// address, leased buffers of the peer's arena at any address and of any length, bytes cut
// anywhere), read as data-plane frames: an error, never a crash, a write outside the
// reader's buffers or a view outside the peer's arena.
#include <cstdint>
#include <cstring>

#include <unistd.h>

#include "runtime/net/shm_channel.hpp"
#include "runtime/net/tensor_frames.hpp"

using namespace ashlar;
using namespace ashlar::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 60000) // the whole input fits in the ring: the writer never waits
    return 0;
  auto w = shm_ring::create(64 << 10, "fuzz");
  if (!w)
    return 0;
  auto r = shm_ring::attach(w->fd(), "fuzz");
  auto unused = shm_ring::create(4096, "unused");
  if (!r || !unused)
    return 0;
  iovec iov{const_cast<uint8_t*>(data), size};
  if (size > 0 && w->write_all(&iov, 1))
    return 0;
  w->close(); // the reader takes what is there, then ends
  // Lent buffers are read from this process: a peer lies about its own memory only.
  shm_channel ch{std::move(*unused), std::move(*r), static_cast<int>(::getpid()), -1, "fuzz"};
  // A peer's arena mapped here (this process's own, made once), for leased pieces.
  static auto arena = shm_arena::make(1 << 20);
  static auto mapped = arena ? map_peer_arena(static_cast<int>(::getpid()), (*arena)->fd(), (*arena)->base(),
                                              (*arena)->size())
                             : expected<std::shared_ptr<peer_arena>>{arena.error()};
  if (mapped)
    ch.share_arenas(nullptr, false, *mapped);
  for (int i = 0; i < 64; ++i) {
    inbound_frame f;
    if (read_frame(ch, f, uint64_t{1} << 20))
      break;
  }
  return 0;
}
