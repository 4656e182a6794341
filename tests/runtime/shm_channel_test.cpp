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
std::unique_ptr<shm_channel> serve_switch(tcp_socket& sock, const std::string& name, std::string& why) {
  shm_pending pending;
  auto offer = shm_server_offer(name, pending, 5s);
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
std::unique_ptr<shm_channel> client_switch(tcp_socket& sock, shm_offer& offer, std::string& why) {
  inbound_frame f;
  REQUIRE_FALSE(read_frame(sock, f));
  auto ch = shm_switch_client(sock, offer, f.text, 5s, why);
  REQUIRE(ch);
  return std::move(*ch);
}

switched run_switch(sock_pair& l, shm_offer& offer) {
  switched out;
  auto server = std::async(std::launch::async, [&] { return serve_switch(l.server, offer.name, out.server_why); });
  out.client = client_switch(l.client, offer, out.client_why);
  out.server = server.get();
  return out;
}

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
