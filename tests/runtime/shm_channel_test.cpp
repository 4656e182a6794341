// The shared-memory channel (runtime/net/shm_channel.hpp): the switch from a connection to
// rings proven to come from its peer, frames whole both ways with large buffers lent, and
// what happens with a segment from someone else, a peer not on this host, a peer killed
// mid-transfer, and lies in the ring.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstring>
#include <future>
#include <thread>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/core/clock.hpp"
#include "runtime/net/shm_channel.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/net/tensor_frames.hpp"

using namespace ashlar;
using namespace ashlar::net;
using namespace std::chrono_literals;

namespace {

// Two ends of one connection (a stream socket pair stands in for the admitted TCP one).
struct sock_pair {
  tcp_socket client, server;
  sock_pair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    client = tcp_socket{sv[0], "client"};
    server = tcp_socket{sv[1], "server"};
  }
};

struct switched {
  std::unique_ptr<shm_channel> client, server;
  std::string client_why, server_why;
};

// The server side of the switch: offer, welcome, answer. Returns its channel (null: TCP).
std::unique_ptr<shm_channel> serve_switch(tcp_socket& sock, const std::string& name, std::string& why,
                                          std::shared_ptr<shm_arena> arena = nullptr) {
  shm_pending pending;
  auto offer = shm_server_offer(name, pending, 5s, std::move(arena));
  const std::string text = offer ? *offer : "tcp " + describe(offer.error());
  REQUIRE_FALSE(write_text_frame(sock, frame_kind::welcome, 0, text));
  if (!offer) {
    why = describe(offer.error());
    return nullptr;
  }
  auto ch = shm_switch_server(sock, pending, 5s, why);
  REQUIRE(ch);
  return std::move(*ch);
}

// The client side: hears the welcome, then switches.
std::unique_ptr<shm_channel> client_switch(tcp_socket& sock, shm_offer& offer, std::string& why,
                                           std::shared_ptr<shm_arena> arena = nullptr) {
  inbound_frame f;
  REQUIRE_FALSE(read_frame(sock, f));
  auto ch = shm_switch_client(sock, offer, f.text, 5s, why, std::move(arena));
  REQUIRE(ch);
  return std::move(*ch);
}

// `client_arena`, `server_arena`: each end's arena for the job (nullptr: none offered).
switched run_switch(sock_pair& l, shm_offer& offer, std::shared_ptr<shm_arena> client_arena = nullptr,
                    std::shared_ptr<shm_arena> server_arena = nullptr) {
  switched out;
  auto server = std::async(std::launch::async, [&] {
    return serve_switch(l.server, offer.name, out.server_why, server_arena);
  });
  out.client = client_switch(l.client, offer, out.client_why, client_arena);
  out.server = server.get();
  return out;
}

// Both ends of one connection switched, each with an arena of `bytes` of address space.
struct arena_pair {
  std::shared_ptr<shm_arena> client_arena, server_arena;
  sock_pair l;
  switched s;
  explicit arena_pair(size_t bytes) {
    auto c = shm_arena::make(bytes);
    auto sv = shm_arena::make(bytes);
    REQUIRE(c);
    REQUIRE(sv);
    client_arena = *c;
    server_arena = *sv;
    auto offer = offer_shm();
    REQUIRE(offer);
    s = run_switch(l, *offer, client_arena, server_arena);
    REQUIRE(s.client);
    REQUIRE(s.server);
  }
};

wire::tensor ramp(size_t n, float from) {
  wire::tensor t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = from + static_cast<float>(i % 9973);
  return t;
}

}  // namespace

TEST_CASE("peers of one host switch to shared memory and frames cross it whole both ways, large tensors lent") {
  sock_pair l;
  auto offer = offer_shm();
  REQUIRE(offer);
  auto s = run_switch(l, *offer);
  REQUIRE(s.client);
  REQUIRE(s.server);
  // A 12 MB push (lent), a small one (copied through the ring), a sparse one (two pieces),
  // one way; a pull reply the other way, while the first direction is busy.
  std::thread writer{[&] {
    wire::push big;
    big.grad = ramp(3 << 20, 1.0f);
    big.batch_size = 7;
    REQUIRE_FALSE(write_frame(*s.client, 1, big));
    CHECK(big.grad.size() == 3u << 20); // left as it was
    wire::push small;
    small.grad = ramp(100, 2.0f);
    REQUIRE_FALSE(write_frame(*s.client, 2, small));
    wire::push sparse;
    sparse.sparse = true;
    sparse.grad = ramp(20000, 3.0f);
    sparse.index.resize(20000);
    for (uint32_t i = 0; i < 20000; ++i)
      sparse.index[i] = 2 * i;
    REQUIRE_FALSE(write_frame(*s.client, 3, sparse));
  }};
  wire::pull_reply rep;
  rep.version = 42;
  rep.params = wire::shared_tensor(ramp(5 << 20, 4.0f));
  // A lent buffer's write returns once the reader took it: another thread writes.
  auto replier = std::async(std::launch::async, [&] { return write_frame(*s.server, 9, rep); });
  inbound_frame back;
  REQUIRE_FALSE(read_frame(*s.client, back));
  CHECK(back.kind == frame_kind::pull_reply);
  CHECK(back.seq == 9);
  CHECK(back.reply.version == 42);
  CHECK(back.reply.params == rep.params);
  CHECK_FALSE(replier.get());
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    inbound_frame f;
    REQUIRE_FALSE(read_frame(*s.server, f));
    REQUIRE(f.kind == frame_kind::push);
    CHECK(f.seq == seq);
    if (seq == 1) {
      CHECK(f.push.batch_size == 7);
      CHECK(f.push.grad == ramp(3 << 20, 1.0f));
    } else if (seq == 2) {
      CHECK(f.push.grad == ramp(100, 2.0f));
    } else {
      CHECK(f.push.grad == ramp(20000, 3.0f));
      REQUIRE(f.push.index.size() == 20000);
      CHECK(f.push.index[19999] == 39998u);
    }
  }
  writer.join();
  // Nothing more crossed the connection: the switch left it quiet.
  REQUIRE_FALSE(l.client.set_timeout(100ms));
  char byte;
  CHECK(l.client.read_exact(&byte, 1));
}

TEST_CASE("a kept write returns before the reader copied its tensor, which its owner keeps alive until it has") {
  sock_pair l;
  auto offer = offer_shm();
  REQUIRE(offer);
  auto s = run_switch(l, *offer);
  REQUIRE(s.client);
  REQUIRE(s.server);
  // Nobody reads yet: the writes return at once, each owner held by the channel.
  std::weak_ptr<wire::pull_reply> first;
  for (uint64_t seq = 1; seq <= 40; ++seq) {
    auto rep = std::make_shared<wire::pull_reply>();
    rep->version = seq;
    rep->params = wire::shared_tensor(ramp(seq == 1 ? 1 << 20 : 300, static_cast<float>(seq)));
    if (seq == 1)
      first = rep;
    s.server->lend_until_fetched(rep);
    REQUIRE_FALSE(write_frame(*s.server, seq, *rep));
  }
  CHECK(s.server->kept() == 40); // the small tensors are lent too: the ring holds heads only
  CHECK_FALSE(first.expired());
  for (uint64_t seq = 1; seq <= 40; ++seq) {
    inbound_frame f;
    REQUIRE_FALSE(read_frame(*s.client, f));
    CHECK(f.seq == seq);
    CHECK(f.reply.params == ramp(seq == 1 ? 1 << 20 : 300, static_cast<float>(seq)));
  }
  // What the reader has copied is let go when asked, or at the next write.
  s.server->release_fetched();
  CHECK(s.server->kept() == 0);
  CHECK(first.expired());
  auto rep = std::make_shared<wire::pull_reply>();
  rep->params = wire::shared_tensor(ramp(1000, 1.0f));
  s.server->lend_until_fetched(rep);
  REQUIRE_FALSE(write_frame(*s.server, 41, *rep));
  CHECK(s.server->kept() == 1);
  inbound_frame f;
  REQUIRE_FALSE(read_frame(*s.client, f));
  wire::push_ack ack;
  REQUIRE_FALSE(write_frame(*s.server, 42, ack));
  CHECK(s.server->kept() == 0);
}

TEST_CASE("a channel closed before the reader copied what a kept write lent fails the read, never hands over "
          "those bytes") {
  sock_pair l;
  auto offer = offer_shm();
  REQUIRE(offer);
  auto s = run_switch(l, *offer);
  REQUIRE(s.client);
  REQUIRE(s.server);
  {
    auto rep = std::make_shared<wire::pull_reply>();
    rep->params = wire::shared_tensor(ramp(1 << 16, 1.0f));
    s.server->lend_until_fetched(rep);
    REQUIRE_FALSE(write_frame(*s.server, 1, *rep));
  }
  // The writer is done with the channel (its owner may now let the buffer go).
  s.server->close();
  inbound_frame f;
  auto err = read_frame(*s.client, f);
  REQUIRE(err);
  CHECK(describe(err).find("closed while a lent buffer was read") != std::string::npos);
}

TEST_CASE("a tensor in the writer's arena is read in place under a lease, which the reader gives back when it "
          "lets go of it; nothing reuses the buffer before") {
  arena_pair p{64 << 20};
  CHECK(p.s.client->reads_in_place());
  CHECK(p.s.client->peer_reads_in_place());
  CHECK(p.s.server->reads_in_place());
  CHECK(p.s.server->peer_reads_in_place());

  // A shard's reply: its version (heap) is copied into the shard's arena once, and the
  // same version's next reply shares that copy.
  const auto values = ramp(1 << 18, 5.0f);
  auto version = std::make_shared<const std::vector<float>>(values.begin(), values.end());
  auto rep = std::make_shared<wire::pull_reply>();
  rep->version = 7;
  rep->params = wire::shared_tensor(version, 0, version->size());
  REQUIRE(p.s.server->share(rep->params, rep->version));
  CHECK(p.server_arena->contains(rep->params.data(), rep->params.size() * sizeof(float)));
  wire::shared_tensor again(version, 0, version->size());
  REQUIRE(p.s.server->share(again, uint64_t{7}));
  CHECK(again.data() == rep->params.data()); // one copy per version
  wire::shared_tensor next_version(version, 0, version->size());
  REQUIRE(p.s.server->share(next_version, uint64_t{8}));
  CHECK(next_version.data() != rep->params.data()); // written in place since: a new copy
  const float* lent_at = rep->params.data();
  p.s.server->lend_until_fetched(rep);
  REQUIRE_FALSE(write_frame(*p.s.server, 1, *rep));
  CHECK(p.s.server->leased() == 1);
  rep.reset();
  again = {};
  next_version = {};

  inbound_frame f;
  REQUIRE_FALSE(read_frame(*p.s.client, f));
  REQUIRE(f.reply.params.size() == size_t{1} << 18);
  CHECK(f.reply.params == wire::shared_tensor(ramp(1 << 18, 5.0f)));
  // Read in place: the reader's view is where this process maps the writer's arena.
  auto theirs = map_peer_arena(static_cast<int>(::getpid()), p.server_arena->fd(), p.server_arena->base(),
                               p.server_arena->size());
  REQUIRE(theirs);
  CHECK(static_cast<const void*>((*theirs)->find(reinterpret_cast<uint64_t>(lent_at), 4))
        == static_cast<const void*>(f.reply.params.data()));
  // While the reader holds its view, the lease stays and the buffer is not handed out again
  // (its version's storage gone, and the arena's cache of it swept at the next share).
  p.s.server->release_fetched();
  CHECK(p.s.server->leased() == 1);
  version.reset();
  wire::shared_tensor sweep(wire::tensor(1 << 16, 0.0f));
  REQUIRE(p.s.server->share(sweep, uint64_t{1}));
  std::vector<std::shared_ptr<float>> fresh;
  for (int i = 0; i < 4; ++i) {
    fresh.push_back(p.server_arena->allocate(1 << 18));
    REQUIRE(fresh.back());
    CHECK(fresh.back().get() != lent_at);
  }
  fresh.clear();
  const size_t in_use = p.server_arena->bytes_in_use();
  f.reply.params = {};
  p.s.server->release_fetched();
  CHECK(p.s.server->leased() == 0);
  CHECK(p.server_arena->bytes_in_use() < in_use); // the copy came back to the arena

  // A push the worker wrote into its arena crosses the other way, read in place too.
  auto push = std::make_shared<wire::push>();
  auto buf = p.client_arena->allocate(1 << 17);
  REQUIRE(buf);
  for (size_t i = 0; i < (1 << 17); ++i)
    buf.get()[i] = static_cast<float>(i);
  push->grad = wire::shared_tensor{std::shared_ptr<const float>(buf), 1 << 17};
  REQUIRE(p.s.client->share(push->grad)); // already there: no copy
  CHECK(push->grad.data() == buf.get());
  buf.reset();
  p.s.client->lend_until_fetched(push);
  REQUIRE_FALSE(write_frame(*p.s.client, 2, *push));
  push.reset();
  inbound_frame g;
  REQUIRE_FALSE(read_frame(*p.s.server, g));
  CHECK(g.push.grad[12345] == 12345.0f);
  CHECK(p.s.client->leased() == 1);
  g.push.grad = {};
  p.s.client->release_fetched();
  CHECK(p.s.client->leased() == 0);
}

TEST_CASE("leases run out at 256 held at once and later writes are lent as copies, and a leased piece read by "
          "copy gives its lease back at once") {
  arena_pair p{size_t{512} << 20};
  const size_t n = size_t{1} << 14; // 64 KiB each
  for (uint64_t seq = 1; seq <= 300; ++seq) {
    auto rep = std::make_shared<wire::pull_reply>();
    rep->version = seq;
    auto buf = p.server_arena->allocate(n);
    REQUIRE(buf);
    std::fill(buf.get(), buf.get() + n, static_cast<float>(seq));
    rep->params = wire::shared_tensor{std::shared_ptr<const float>(std::move(buf)), n};
    p.s.server->lend_until_fetched(rep);
    REQUIRE_FALSE(write_frame(*p.s.server, seq, *rep));
  }
  CHECK(p.s.server->leased() == shm_ring::lease_slots);
  CHECK(p.s.server->kept() == 300);
  std::vector<inbound_frame> held(300);
  for (auto& f : held)
    REQUIRE_FALSE(read_frame(*p.s.client, f));
  for (uint64_t seq = 1; seq <= 300; ++seq)
    CHECK(held[seq - 1].reply.params[n - 1] == static_cast<float>(seq));
  held.clear(); // the views go: every lease comes back
  p.s.server->release_fetched();
  CHECK(p.s.server->leased() == 0);
  CHECK(p.s.server->kept() == 0);

  // A leased piece read with read_exact (a copy out of the mapping) gives its lease back.
  auto rep = std::make_shared<wire::pull_reply>();
  auto buf = p.server_arena->allocate(n);
  REQUIRE(buf);
  std::fill(buf.get(), buf.get() + n, 7.0f);
  rep->params = wire::shared_tensor{std::shared_ptr<const float>(std::move(buf)), n};
  p.s.server->lend_until_fetched(rep);
  iovec parts[3] = {{nullptr, 0}, {nullptr, 0}, {const_cast<float*>(rep->params.data()), n * sizeof(float)}};
  REQUIRE_FALSE(p.s.server->write_all(parts, 3));
  CHECK(p.s.server->leased() == 1);
  std::vector<float> copy(n);
  REQUIRE_FALSE(p.s.client->read_exact(copy.data(), n * sizeof(float)));
  CHECK(copy[n / 2] == 7.0f);
  p.s.server->release_fetched();
  CHECK(p.s.server->leased() == 0);
}

TEST_CASE("a reader that goes gives back the leases of what it never read, and keeps those it holds views of") {
  arena_pair p{size_t{64} << 20};
  const size_t n = size_t{1} << 14;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    auto rep = std::make_shared<wire::pull_reply>();
    auto buf = p.server_arena->allocate(n);
    REQUIRE(buf);
    std::fill(buf.get(), buf.get() + n, 1.0f);
    rep->params = wire::shared_tensor{std::shared_ptr<const float>(std::move(buf)), n};
    p.s.server->lend_until_fetched(rep);
    REQUIRE_FALSE(write_frame(*p.s.server, seq, *rep));
  }
  inbound_frame first;
  REQUIRE_FALSE(read_frame(*p.s.client, first)); // a view: its lease stays with it
  p.s.client.reset(); // the reader goes with two frames unread
  p.s.server->release_fetched();
  CHECK(p.s.server->leased() == 1);
  first.reply.params = {};
  p.s.server->release_fetched();
  CHECK(p.s.server->leased() == 0);
}

TEST_CASE("a closed channel's buffers that the peer still reads in place stay until it lets go, and a buffer of "
          "another job's arena is copied, never lent") {
  auto job_a = shm_arena::make(64 << 20);
  auto job_a_peer = shm_arena::make(64 << 20);
  auto job_b = shm_arena::make(64 << 20);
  REQUIRE(job_a);
  REQUIRE(job_a_peer);
  REQUIRE(job_b);
  sock_pair l;
  auto offer = offer_shm();
  REQUIRE(offer);
  auto s = run_switch(l, *offer, *job_a_peer, *job_a);
  REQUIRE(s.server);
  REQUIRE(s.client);
  // A tensor of job B's arena written on job A's connection is copied into A's arena.
  auto b_buf = (*job_b)->allocate(1 << 16);
  REQUIRE(b_buf);
  wire::shared_tensor b_tensor{std::shared_ptr<const float>(b_buf), 1 << 16};
  REQUIRE(s.server->share(b_tensor));
  CHECK_FALSE((*job_b)->contains(b_tensor.data(), 4));
  CHECK((*job_a)->contains(b_tensor.data(), 4));

  auto rep = std::make_shared<wire::pull_reply>();
  rep->params = b_tensor;
  const float* lent_at = rep->params.data();
  s.server->lend_until_fetched(rep);
  REQUIRE_FALSE(write_frame(*s.server, 1, *rep));
  rep.reset();
  b_tensor = {};
  inbound_frame f;
  REQUIRE_FALSE(read_frame(*s.client, f));
  REQUIRE(f.reply.params.size() == size_t{1} << 16);
  // The writer's channel goes while the reader holds its view: the arena keeps the buffer.
  s.server.reset();
  for (int i = 0; i < 4; ++i) {
    auto other = (*job_a)->allocate(1 << 16);
    REQUIRE(other);
    CHECK(other.get() != lent_at);
  }
  f.reply.params = {}; // let go: the next allocation may take it again
  bool reused = false;
  std::vector<std::shared_ptr<float>> held;
  for (int i = 0; i < 8 && !reused; ++i) {
    held.push_back((*job_a)->allocate(1 << 16));
    reused = held.back().get() == lent_at;
  }
  CHECK(reused);
}

TEST_CASE("segments passed by another process than the connection's peer are refused, and both stay on TCP") {
  sock_pair l;
  auto offer = offer_shm();
  REQUIRE(offer);
  // Someone else on this host reaches the offer first with segments of its own (another
  // job's process, say): it has no nonce of this connection.
  shm_pending rogue;
  REQUIRE(shm_server_offer(offer->name, rogue, 5s));
  auto s = run_switch(l, *offer);
  CHECK_FALSE(s.client);
  CHECK_FALSE(s.server);
  CHECK_THAT(s.client_why, Catch::Contains("nonce"));
  CHECK_THAT(s.server_why, Catch::Contains("nonce"));
  // The connection goes on, over TCP.
  REQUIRE_FALSE(write_text_frame(l.client, frame_kind::hello, 5, "still here"));
  inbound_frame f;
  REQUIRE_FALSE(read_frame(l.server, f));
  CHECK(f.text == "still here");
}

TEST_CASE("a peer whose offer this process cannot reach (another host or network namespace) is told why and stays "
          "on TCP") {
  shm_pending pending;
  auto offer = shm_server_offer("ashlar-dp-" + std::string(32, 'a'), pending, 1s);
  REQUIRE_FALSE(offer);
  CHECK_THAT(describe(offer.error()), Catch::Contains("not reachable from here"));
  // The client hears "tcp <why>" and says so.
  sock_pair l;
  auto mine = offer_shm();
  REQUIRE(mine);
  std::string why;
  auto ch = shm_switch_client(l.client, *mine, "tcp " + describe(offer.error()), 1s, why);
  REQUIRE(ch);
  CHECK_FALSE(*ch);
  CHECK_THAT(why, Catch::Contains("not reachable from here"));
  CHECK(shm_name_in_hello("7 3" + shm_hello_part(*mine)) == mine->name);
  CHECK_FALSE(shm_name_in_hello("7 3 shm=../../etc"));
}

TEST_CASE("a peer killed mid-transfer ends the channel's reads and writes within seconds, not never") {
  sock_pair l;
  auto offer = offer_shm();
  REQUIRE(offer);
  const auto name = offer->name;
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) { // the shard side: switches, reads a little, then hangs until killed
    std::string why;
    auto ch = serve_switch(l.server, name, why);
    char buf[64];
    if (!ch || ch->read_exact(buf, sizeof buf))
      ::_exit(1);
    for (;;)
      ::pause();
  }
  l.server = tcp_socket{}; // the child's end, closed here
  std::string why;
  auto ch = client_switch(l.client, *offer, why);
  REQUIRE(ch);
  // The child takes 64 bytes and then nothing: a lent 8 MB buffer waits for it, and
  // its death ends the wait.
  auto big = ramp(2 << 20, 5.0f);
  char head[64] = {};
  iovec first{head, sizeof head};
  REQUIRE_FALSE(ch->write_all(&first, 1));
  auto killer = std::async(std::launch::async, [&] {
    pause_for(300ms);
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  });
  const auto t0 = steady_now();
  iovec lent{big.data(), big.size() * sizeof(float)};
  auto err = ch->write_all(&lent, 1);
  killer.get();
  REQUIRE(err);
  CHECK(is(err, errc::peer_unreachable));
  CHECK(steady_now() - t0 < 5s);
  // A read after it fails too, at once.
  char buf[8];
  CHECK(ch->read_exact(buf, sizeof buf));
}

TEST_CASE("lies in the ring (a lent buffer outside the peer's memory, an empty piece) fail the read, never crash") {
  auto a = shm_ring::create(64 << 10, "lies");
  REQUIRE(a);
  auto b = shm_ring::attach(a->fd(), "lies");
  REQUIRE(b);
  auto unused = shm_ring::create(64 << 10, "unused");
  REQUIRE(unused);
  shm_channel reader{std::move(*unused), std::move(*b), static_cast<int>(::getpid()), -1, "liar"};
  SECTION("a lent buffer at an address the peer does not have") {
    const uint64_t head[2] = {(uint64_t{1} << 63) | 4096, 16}; // lent, 4 KiB at address 16
    iovec iov{const_cast<uint64_t*>(head), sizeof head};
    REQUIRE_FALSE(a->write_all(&iov, 1));
    char buf[4096];
    auto err = reader.read_exact(buf, sizeof buf);
    REQUIRE(err);
    CHECK(is(err, errc::malformed_message));
  }
  SECTION("a leased buffer outside the peer's arena, or not lent") {
    // The reader maps a real arena; the head names an address outside it: read_view
    // declines, and the copy from the peer's memory fails as for any lent buffer.
    auto arena = shm_arena::make(1 << 20);
    REQUIRE(arena);
    auto mapped = map_peer_arena(static_cast<int>(::getpid()), (*arena)->fd(), (*arena)->base(), (*arena)->size());
    REQUIRE(mapped);
    reader.share_arenas(nullptr, false, *mapped);
    const bool lent = GENERATE(true, false);
    const uint64_t length = (lent ? uint64_t{1} << 63 : 0) | (uint64_t{1} << 62) | (uint64_t{3} << 48) | 4096;
    const uint64_t head[2] = {length, 16}; // outside the arena, and nothing the peer has
    iovec iov{const_cast<uint64_t*>(head), sizeof head};
    REQUIRE_FALSE(a->write_all(&iov, 1));
    CHECK(reader.read_view(4096) == nullptr);
    char buf[4096];
    auto err = reader.read_exact(buf, sizeof buf);
    REQUIRE(err);
    CHECK(is(err, errc::malformed_message));
  }
  SECTION("an empty piece") {
    const uint64_t head[2] = {0, 0};
    iovec iov{const_cast<uint64_t*>(head), sizeof head};
    REQUIRE_FALSE(a->write_all(&iov, 1));
    char buf[8];
    auto err = reader.read_exact(buf, sizeof buf);
    REQUIRE(err);
    CHECK(is(err, errc::malformed_message));
  }
}
