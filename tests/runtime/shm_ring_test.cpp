// The shared-memory ring (runtime/net/shm_ring.hpp): bytes whole across two mappings and
// across processes, a peer that dies or writes nonsense into the shared header.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/net/shm_ring.hpp"

using namespace ashlar;
using namespace ashlar::net;
using namespace std::chrono_literals;

namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng{seed};
  for (auto& b : v)
    b = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace

TEST_CASE("a shared-memory ring carries bytes whole between two mappings, in any split, waiting for room and for "
          "bytes") {
  auto w = shm_ring::create(64 << 10, "ashlar-test");
  REQUIRE(w);
  auto r = shm_ring::attach(w->fd(), "ashlar-test");
  REQUIRE(r);
  CHECK(r->capacity() == 64 << 10);
  const auto data = pattern(5 << 20, 7);
  std::thread writer{[&] {
    std::mt19937 rng{1};
    size_t at = 0;
    while (at < data.size()) { // pieces of 1 byte to 300 KiB, two buffers a write
      size_t a = std::min<size_t>(data.size() - at, 1 + rng() % (300 << 10));
      size_t b = std::min<size_t>(data.size() - at - a, rng() % 1000);
      iovec iov[2] = {{const_cast<uint8_t*>(data.data() + at), a}, {const_cast<uint8_t*>(data.data() + at + a), b}};
      REQUIRE_FALSE(w->write_all(iov, 2));
      at += a + b;
    }
  }};
  std::vector<uint8_t> got(data.size());
  std::mt19937 rng{2};
  for (size_t at = 0; at < got.size();) {
    size_t n = std::min<size_t>(got.size() - at, 1 + rng() % (200 << 10));
    REQUIRE_FALSE(r->read_exact(got.data() + at, n, 10s));
    at += n;
  }
  writer.join();
  CHECK(got == data);
}

TEST_CASE("a shared-memory ring carries bytes from another process, and a reader sees a killed writer as silence "
          "within its patience, a closed ring at once") {
  auto ring = shm_ring::create(1 << 20, "ashlar-test");
  REQUIRE(ring);
  const auto data = pattern(8 << 20, 3);
  auto w = shm_ring::attach(ring->fd(), "child"); // mapped before the fork: the child allocates nothing
  REQUIRE(w);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) { // the writer: everything, then 1000 bytes more, and it hangs until killed
    iovec all{const_cast<uint8_t*>(data.data()), data.size()};
    if (w->write_all(&all, 1))
      ::_exit(3);
    iovec more{const_cast<uint8_t*>(data.data()), 1000};
    (void) w->write_all(&more, 1);
    ::pause();
    ::_exit(0);
  }
  std::vector<uint8_t> got(data.size());
  REQUIRE_FALSE(ring->read_exact(got.data(), got.size(), 20s));
  CHECK(got == data);
  std::vector<uint8_t> more(1000);
  REQUIRE_FALSE(ring->read_exact(more.data(), more.size(), 20s));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  auto silent = ring->read_exact(more.data(), 1, 300ms);
  REQUIRE(silent);
  CHECK(is(silent, errc::peer_unreachable));
  std::thread closer{[&] {
    std::this_thread::sleep_for(100ms);
    ring->close();
  }};
  auto closed = ring->read_exact(more.data(), 1, 30s);
  closer.join();
  REQUIRE(closed);
  CHECK(describe(closed).find("closed") != std::string::npos);
}

TEST_CASE("a segment that is not a sealed ring is refused, and nonsense written into a ring's header ends the "
          "stream with an error, never a read outside the mapping") {
  int plain = ::memfd_create("ashlar-test-plain", MFD_CLOEXEC);
  REQUIRE(plain >= 0);
  REQUIRE(::ftruncate(plain, 1 << 20) == 0);
  auto unsealed = shm_ring::attach(plain, "plain");
  REQUIRE_FALSE(unsealed);
  CHECK(describe(unsealed.error()).find("not sealed") != std::string::npos);
  ::close(plain);

  auto ring = shm_ring::create(64 << 10, "ashlar-test");
  REQUIRE(ring);
  auto peer = shm_ring::attach(ring->fd(), "peer");
  REQUIRE(peer);
  // The peer's view of the header, written as a hostile peer would.
  void* raw = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ring->fd(), 0);
  REQUIRE(raw != MAP_FAILED);
  auto* words = static_cast<uint64_t*>(raw);
  words[8] = uint64_t{1} << 40; // `written`, far past what the ring holds
  std::vector<uint8_t> buf(16);
  auto err = ring->read_exact(buf.data(), buf.size(), 1s);
  REQUIRE(err);
  CHECK(is(err, errc::malformed_message));
  CHECK(describe(err).find("make no sense") != std::string::npos);
  words[8] = 0;
  words[0] = 0; // the magic
  auto again = shm_ring::attach(ring->fd(), "again");
  REQUIRE_FALSE(again);
  CHECK(describe(again.error()).find("magic or capacity") != std::string::npos);
  ::munmap(raw, 4096);
}
