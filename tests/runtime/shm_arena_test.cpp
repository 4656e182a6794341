// A process's shared-memory arena for a job (runtime/net/shm_arena.hpp): buffers handed
// out and taken back by size, pages given back past the cache, one copy per parameter
// version, one arena per job, and a peer's mapping checked before it is used.
#include <catch2/catch.hpp>

#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/net/shm_arena.hpp"

using namespace ashlar;
using namespace ashlar::net;

TEST_CASE("an arena hands out page-aligned buffers, takes them back by size, and fails when full") {
  auto a = shm_arena::make(1 << 20); // 256 pages
  REQUIRE(a);
  auto& arena = **a;
  auto x = arena.allocate(1000); // one page
  REQUIRE(x);
  CHECK(reinterpret_cast<uintptr_t>(x.get()) % 4096 == 0);
  CHECK(arena.contains(x.get(), 4000));
  CHECK_FALSE(arena.contains(x.get(), (1 << 20) + 1));
  int local = 0;
  CHECK_FALSE(arena.contains(&local, sizeof local));
  CHECK(arena.bytes_in_use() == 4096);
  float* at = x.get();
  x.reset();
  CHECK(arena.bytes_in_use() == 0);
  CHECK(arena.bytes_cached() == 4096);
  auto y = arena.allocate(900); // the same size class: the same pages again
  CHECK(y.get() == at);
  auto big = arena.allocate(255 * 1024); // the rest
  REQUIRE(big);
  CHECK(arena.allocate(1024) == nullptr); // full: the caller uses the heap
}

TEST_CASE("an arena's let-go pages beyond its cache go back to the system") {
  auto a = shm_arena::make(size_t{256} << 20);
  REQUIRE(a);
  auto& arena = **a;
  const size_t n = (shm_arena::resident_cache / sizeof(float)) / 2; // half the cache each
  std::vector<std::shared_ptr<float>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(arena.allocate(n));
    REQUIRE(held.back());
    std::memset(held.back().get(), 1, n * sizeof(float));
  }
  held.clear();
  CHECK(arena.bytes_cached() <= shm_arena::resident_cache);
  CHECK(arena.bytes_in_use() == 0);
  // A block whose pages went back reads as zeros when handed out again.
  std::vector<std::shared_ptr<float>> again;
  bool zeros = false;
  for (int i = 0; i < 3; ++i) {
    again.push_back(arena.allocate(n));
    zeros = zeros || again.back().get()[0] == 0.0f;
  }
  CHECK(zeros);
}

TEST_CASE("an arena shares one copy of a parameter version while its storage lives, and a new one for a new "
          "version") {
  auto a = shm_arena::make(size_t{64} << 20);
  REQUIRE(a);
  auto& arena = **a;
  auto storage = std::make_shared<std::vector<float>>(1 << 16, 1.0f);
  wire::shared_tensor t{storage, 0, storage->size()};
  auto c1 = arena.share(t, uint64_t{3});
  REQUIRE(c1);
  CHECK(arena.contains(c1->data(), 4));
  CHECK(*c1 == t);
  auto c2 = arena.share(t, uint64_t{3});
  REQUIRE(c2);
  CHECK(c2->data() == c1->data());
  // A window of the same storage is a copy of its own.
  auto w = arena.share(t.window(1 << 15, 1 << 15), uint64_t{3});
  REQUIRE(w);
  CHECK(w->data() != c1->data());
  // Written in place for version 4: a new copy, the old one no longer kept.
  (*storage)[0] = 2.0f;
  auto c3 = arena.share(t, uint64_t{4});
  REQUIRE(c3);
  CHECK(c3->data() != c1->data());
  CHECK((*c3)[0] == 2.0f);
  CHECK((*c1)[0] == 1.0f); // what a reader of version 3 holds does not change
  // Without a version nothing is kept: each share copies.
  auto p1 = arena.share(t);
  auto p2 = arena.share(t);
  REQUIRE(p1);
  REQUIRE(p2);
  CHECK(p1->data() != p2->data());
  // A tensor already in the arena is itself; a small one is not shared.
  auto same = arena.share(*c3);
  REQUIRE(same);
  CHECK(same->data() == c3->data());
  CHECK_FALSE(arena.share(wire::shared_tensor{1.0f, 2.0f}));
  // The storage goes: its copies go once nobody holds them.
  const size_t before = arena.bytes_in_use();
  c1.reset();
  c2.reset();
  c3.reset();
  same.reset();
  w.reset();
  t = {};
  storage.reset();
  arena.share(wire::shared_tensor(wire::tensor(1 << 16, 0.5f)), uint64_t{1}); // (the sweep runs at a share)
  CHECK(arena.bytes_in_use() < before);
}

TEST_CASE("each job has its own arena in a process, kept while anything holds it") {
  auto a1 = shm_arena::for_job("job-a-key");
  auto a2 = shm_arena::for_job("job-a-key");
  auto b = shm_arena::for_job("job-b-key");
  REQUIRE(a1);
  REQUIRE(a2);
  REQUIRE(b);
  CHECK(a1->get() == a2->get());
  CHECK(a1->get() != b->get());
  CHECK((*a1)->fd() != (*b)->fd());
  // Mode 0600, size sealed: nobody shrinks it under a peer's mapping.
  struct stat st{};
  REQUIRE(::fstat((*a1)->fd(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK((::fcntl((*a1)->fd(), F_GET_SEALS) & F_SEAL_SHRINK) != 0);
}

TEST_CASE("a peer's arena is mapped only as a sealed memory segment of the size it claims, once per process") {
  auto a = shm_arena::make(1 << 20);
  REQUIRE(a);
  const int pid = static_cast<int>(::getpid());
  auto ok = map_peer_arena(pid, (*a)->fd(), (*a)->base(), (*a)->size());
  REQUIRE(ok);
  auto mine = (*a)->allocate(10);
  mine.get()[3] = 42.0f;
  const uint8_t* seen = (*ok)->find(reinterpret_cast<uint64_t>(mine.get()), 40);
  REQUIRE(seen != nullptr);
  float v = 0;
  std::memcpy(&v, seen + 12, 4);
  CHECK(v == 42.0f);
  CHECK((*ok)->find((*a)->base() + (*a)->size() - 8, 16) == nullptr); // runs past its end
  // Mapped once in a process, however many connections to that peer map it.
  auto twice = map_peer_arena(pid, (*a)->fd(), (*a)->base(), (*a)->size());
  REQUIRE(twice);
  CHECK(twice->get() == ok->get());
  CHECK((*ok)->find((*a)->base() - 4, 8) == nullptr);
  // Larger than the segment: refused.
  auto too_big = map_peer_arena(pid, (*a)->fd(), (*a)->base(), (*a)->size() * 2);
  REQUIRE_FALSE(too_big);
  CHECK(is(too_big.error(), errc::malformed_message));
  // An unsealed segment (it could shrink under the mapping): refused.
  int loose = ::memfd_create("loose", MFD_CLOEXEC);
  REQUIRE(loose >= 0);
  REQUIRE(::ftruncate(loose, 1 << 20) == 0);
  auto unsealed = map_peer_arena(pid, loose, 0, 1 << 20);
  ::close(loose);
  REQUIRE_FALSE(unsealed);
  CHECK(describe(unsealed.error()).find("not sealed") != std::string::npos);
  // Not a descriptor of that process.
  auto none = map_peer_arena(pid, 100000, 0, 1 << 20);
  REQUIRE_FALSE(none);
}
