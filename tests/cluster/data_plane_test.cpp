// The tensor data plane: a shard served on a TCP port and reached through a stand-in
// actor, in one process (the same code runs between node processes; see
// cluster_process_test.cpp for that).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>

#include "actors/cluster/data_plane.hpp"
#include "actors/server_shard.hpp"
#include "runtime/net/handshake.hpp"
#include "runtime/net/shm_arena.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/net/tensor_frames.hpp"
#include "runtime/wire/codec.hpp"
#include "runtime/net/tls.hpp"
#include "../runtime/temp_dir.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <fstream>
#include <thread>

#include "../actors/held_push.hpp"

using namespace ashlar;
using namespace ashlar::actors;
using namespace std::chrono_literals;
using ashlar::test::temp_dir;

namespace {

struct config : caf::actor_system_config {
  config() {
    register_types(*this);
  }
};

struct fixture {
  config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::shared_ptr<data_plane> plane = std::make_shared<data_plane>(sys);
  std::vector<shard_actor> shards;

  ~fixture() {
    for (auto& s : shards)
      self->send_exit(s, caf::exit_reason::user_shutdown);
    plane->stop();
  }

  /// `core`, when given, is where the shard's state machine stays (read it only while
  /// the shard is idle); `storage` is where its versions live (shard_core::use_storage).
  shard_actor make(const std::string& policy, size_t n, shard_core** core = nullptr,
                   shard_core::buffer_source storage = {}, std::function<void()> reclaim = {}) {
    auto p = make_policy(policy, {});
    REQUIRE(p);
    sgd_config opt;
    opt.lr = 1.0f;
    opt.momentum = 0.0f;
    opt.weight_decay = 0.0f;
    std::vector<float> init(n);
    for (size_t i = 0; i < n; ++i)
      init[i] = static_cast<float>(i);
    auto c = std::make_unique<shard_core>(shard_range{0, 0, n}, init, opt, std::move(*p));
    if (storage)
      c->use_storage(std::move(storage), std::move(reclaim));
    if (core != nullptr)
      *core = c.get();
    auto s = spawn_shard(sys, std::move(c));
    shards.push_back(s);
    return s;
  }

  std::string serve(const shard_actor& s, const std::string& key = "k1") {
    auto ep = plane->serve(0, s, key, "127.0.0.1");
    REQUIRE(ep);
    return *ep;
  }

  shard_actor connect(const shard_actor& s, const std::string& ep, const std::string& key = "k1") {
    auto p = plane->connect(s, 0, ep, key, caf::actor_cast<caf::actor>(self), 5s);
    INFO((p ? std::string{} : describe(p.error())));
    REQUIRE(p);
    return *p;
  }

  caf::error join(const shard_actor& s, uint32_t w) {
    caf::error err;
    self->request(s, 5s, wire::membership_change{wire::membership_change::join, w, ""})
      .receive([](uint64_t) {}, [&](caf::error& e) { err = e; });
    return err;
  }

  expected<wire::pull_reply> pull(const shard_actor& s, uint32_t w) {
    expected<wire::pull_reply> out = caf::error{};
    self->request(s, 5s, wire::pull_request{w, 0, false})
      .receive([&](wire::pull_reply& r) { out = std::move(r); }, [&](caf::error& e) { out = e; });
    return out;
  }

  expected<wire::push_ack> push(const shard_actor& s, uint32_t w, uint64_t base, wire::tensor g) {
    expected<wire::push_ack> out = caf::error{};
    self->request(s, 5s, wire::push{w, 0, base, 1, std::move(g)})
      .receive([&](const wire::push_ack& a) { out = a; }, [&](caf::error& e) { out = e; });
    return out;
  }
};

// A client of the data port that proves `key` and sends its hello for shard 0, as a
// stand-in does: the connection sealed, ready for frames.
net::tcp_socket admitted_client(const std::string& ep, const std::string& key) {
  auto colon = ep.rfind(':');
  auto raw = net::connect_tcp(ep.substr(0, colon), static_cast<uint16_t>(std::stoi(ep.substr(colon + 1))), 2s);
  REQUIRE(raw);
  int fd = raw->release();
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  net::net_security sec;
  sec.token = key;
  net::handshake hs{fd, false, sec};
  REQUIRE(net::run_handshake(hs, 5s) == net::handshake::result::admitted);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  net::tcp_socket sock{fd, ep};
  const auto keys = hs.keys();
  sock.seal(keys.client_tx, keys.server_tx);
  REQUIRE_FALSE(sock.set_timeout(5s));
  REQUIRE_FALSE(net::write_text_frame(sock, net::frame_kind::hello, 0, std::to_string(wire::protocol_version) + " 0"));
  net::inbound_frame welcome;
  REQUIRE_FALSE(net::read_frame(sock, welcome));
  REQUIRE(welcome.kind == net::frame_kind::welcome);
  return sock;
}

}  // namespace

TEST_CASE("pulls, pushes and status through the data plane match the shard's own answers, over shared memory and "
          "over TCP") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  const size_t n = 1 << 20; // 4 MB tensors: lent, not copied through the ring
  auto s = f.make("asp", n);
  auto proxy = f.connect(s, f.serve(s));
  // Both ends of the one connection are in this process's data plane (the shard's end
  // takes its channel just after it answered).
  for (int i = 0; i < 100 && f.plane->shared_memory_connections() != (shm ? 2u : 0u); ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(f.plane->shared_memory_connections() == (shm ? 2u : 0u));
  REQUIRE_FALSE(f.join(proxy, 0)); // over CAF, delegated
  auto before = f.pull(proxy, 0);
  REQUIRE(before);
  CHECK(before->params.size() == n);
  CHECK(before->params[999] == 999.0f);
  auto ack = f.push(proxy, 0, before->version, wire::tensor(n, 0.5f));
  REQUIRE(ack);
  CHECK(ack->outcome == wire::push_ack::applied);
  CHECK(ack->version == 1);
  auto after_proxy = f.pull(proxy, 0);
  auto after_direct = f.pull(s, 0);
  REQUIRE(after_proxy);
  REQUIRE(after_direct);
  CHECK(after_proxy->version == 1);
  CHECK(after_proxy->params == after_direct->params);
  CHECK(after_proxy->params[10] == 9.5f);
  wire::shard_status st;
  f.self->request(proxy, 5s, status_atom::value).receive([&](const wire::shard_status& x) { st = x; },
                                                         [](caf::error&) {});
  CHECK(st.version == 1);
  CHECK(st.pushes == 1);
}

TEST_CASE("a shard that keeps its versions in the job's shared memory, as a node's does, is read where it wrote "
          "them by a worker of its host; an update while a worker holds a version goes to another buffer") {
  fixture f;
  f.plane->use_shared_memory(true);
  const size_t n = 1 << 18; // 1 MB
  shard_core* core = nullptr;
  auto s = f.make("asp", n, &core, f.plane->tensor_buffers("k1"));
  auto arena = net::shm_arena::for_job("k1"); // this process's for the job: the node's
  REQUIRE(arena);
  CHECK((*arena)->contains(core->params().data(), n * sizeof(float)));
  auto proxy = f.connect(s, f.serve(s));
  for (int i = 0; i < 100 && f.plane->shared_memory_connections() != 2u; ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(f.plane->shared_memory_connections() == 2u);
  REQUIRE_FALSE(f.join(s, 0));
  // Where the worker's view lies in the shard's arena (the worker maps it once per process).
  auto theirs = net::map_peer_arena(static_cast<int>(::getpid()), (*arena)->fd(), (*arena)->base(), (*arena)->size());
  REQUIRE(theirs);
  auto in_shard = [&](const float* view) {
    return reinterpret_cast<const float*>((*arena)->base() + (reinterpret_cast<const uint8_t*>(view) - (*theirs)->at));
  };
  auto first = f.pull(proxy, 0);
  REQUIRE(first);
  REQUIRE((*theirs)->find(reinterpret_cast<uint64_t>(core->params().data()), n * sizeof(float)) != nullptr);
  CHECK(in_shard(first->params.data()) == core->params().data()); // no copy: the version itself
  const float* version0 = core->params().data();
  // The worker holds version 0 while a push makes version 1: written elsewhere.
  auto ack = f.push(proxy, 0, first->version, wire::tensor(n, 0.5f));
  REQUIRE(ack);
  CHECK(ack->version == 1);
  auto second = f.pull(proxy, 0);
  REQUIRE(second);
  CHECK(second->version == 1);
  CHECK(core->params().data() != version0);
  CHECK((*arena)->contains(core->params().data(), n * sizeof(float)));
  CHECK(in_shard(second->params.data()) == core->params().data());
  CHECK(first->params[10] == 10.0f); // as it was read
  CHECK(second->params[10] == 9.5f);
}

TEST_CASE("a version whose co-located readers let go of it is updated in place, though their connections sent "
          "nothing since") {
  fixture f;
  f.plane->use_shared_memory(true);
  const size_t n = 1 << 18;
  shard_core* core = nullptr;
  auto s = f.make("asp", n, &core, f.plane->tensor_buffers("k1"), f.plane->tensor_reclaim("k1"));
  const auto ep = f.serve(s);
  auto reader = f.connect(s, ep);
  auto pusher = f.connect(s, ep);
  for (int i = 0; i < 100 && f.plane->shared_memory_connections() != 4u; ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(f.plane->shared_memory_connections() == 4u);
  REQUIRE_FALSE(f.join(s, 0));
  REQUIRE_FALSE(f.join(s, 1));
  // Worker 0 reads version 0 and copies it, as a worker does, and lets go of the view;
  // its connection then carries nothing while it computes.
  std::vector<float> copied;
  {
    auto read = f.pull(reader, 0);
    REQUIRE(read);
    copied.assign(read->params.begin(), read->params.end());
  }
  const float* version0 = core->params().data();
  // Worker 1's push: nobody reads version 0 any longer, so version 1 is written over it.
  auto ack = f.push(pusher, 1, 0, wire::tensor(n, 0.5f));
  REQUIRE(ack);
  CHECK(ack->version == 1);
  CHECK(core->params().data() == version0);
  CHECK(core->params()[10] == 9.5f);
  CHECK(copied[10] == 10.0f);
  // A reader that still holds its view keeps its version: the next update goes elsewhere.
  auto held = f.pull(reader, 0);
  REQUIRE(held);
  REQUIRE(f.push(pusher, 1, 1, wire::tensor(n, 0.5f)));
  CHECK(core->params().data() != version0);
  CHECK(held->params[10] == 9.5f);
  CHECK(core->params()[10] == 9.0f);
}

TEST_CASE("a read the policy holds back is answered over the data plane once the round completes") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  auto s = f.make("bsp", 4);
  auto proxy = f.connect(s, f.serve(s));
  REQUIRE_FALSE(f.join(s, 0));
  REQUIRE_FALSE(f.join(s, 1));
  auto ack = f.push(proxy, 0, 0, wire::tensor(4, 1.0f));
  REQUIRE(ack);
  CHECK(ack->outcome == wire::push_ack::buffered);
  f.self->send(proxy, wire::pull_request{0, 0, false});
  bool early = false;
  f.self->receive([&](const wire::pull_reply&) { early = true; }, caf::after(200ms) >> [] {});
  CHECK_FALSE(early);
  // A later request on the same connection is not stuck behind the held read.
  wire::shard_status st;
  f.self->request(proxy, 5s, status_atom::value).receive([&](const wire::shard_status& x) { st = x; },
                                                         [](caf::error&) {});
  CHECK(st.pending_reads == 1);
  REQUIRE(f.push(s, 1, 0, wire::tensor(4, 3.0f)));
  wire::pull_reply reply;
  bool got = false;
  f.self->receive([&](wire::pull_reply& r) { reply = std::move(r); got = true; }, caf::after(5s) >> [] {});
  REQUIRE(got);
  CHECK(reply.version == 1);
  CHECK(reply.params == wire::tensor{-2, -1, 0, 1});
}

TEST_CASE("a push whose read follows is answered over the data plane after that read, once the round completes, "
          "and gives its tensor's bytes of the node's budget back before") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  const size_t n = 4096; // 16 KiB a push; the budget takes one
  f.plane->limit_in_flight(20 << 10, 2s);
  auto s = f.make("bsp", n);
  auto ep = f.serve(s);
  auto first = f.connect(s, ep);
  auto second = f.connect(s, ep);
  REQUIRE_FALSE(f.join(s, 0));
  REQUIRE_FALSE(f.join(s, 1));
  // Worker 0: its push and the read behind it; neither is answered before the round.
  test::push_then_read(f.self, first, wire::push{0, 0, 0, 1, wire::tensor(n, 1.0f)});
  CHECK_FALSE(test::answered_within(f.self, 300ms));
  // Its tensor is in the round: its bytes are back, though its answer is held.
  for (int i = 0; i < 50 && f.plane->in_flight_bytes() != 0; ++i)
    std::this_thread::sleep_for(20ms);
  CHECK(f.plane->in_flight_bytes() == 0);
  // Worker 1's push completes the round through the budget the first one gave back.
  const auto t0 = std::chrono::steady_clock::now();
  auto ack = f.push(second, 1, 0, wire::tensor(n, 3.0f));
  REQUIRE(ack);
  CHECK(ack->version == 1);
  CHECK(std::chrono::steady_clock::now() - t0 < 1500ms);
  const auto order = test::next_answers(
    f.self,
    [](const wire::pull_reply& r) {
      CHECK(r.version == 1);
      CHECK(r.params[10] == Approx(10.0f - 2.0f));
    },
    [](const wire::push_ack& a) { CHECK(a.outcome == wire::push_ack::buffered); });
  CHECK(order == std::vector<std::string>{"reply", "ack"});
}

TEST_CASE("a shard's error reaches the worker through the data plane, and the connection goes on") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  auto s = f.make("asp", 8);
  auto proxy = f.connect(s, f.serve(s));
  REQUIRE_FALSE(f.join(s, 0));
  auto bad = f.push(proxy, 0, 0, wire::tensor(3, 1.0f)); // wrong length
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("shard 0") != std::string::npos);
  auto good = f.push(proxy, 0, 0, wire::tensor(8, 1.0f));
  REQUIRE(good);
  CHECK(good->version == 1);
}

TEST_CASE("a data connection with the wrong key is refused, naming the endpoint") {
  fixture f;
  auto s = f.make("asp", 8);
  auto ep = f.serve(s, "right");
  auto p = f.plane->connect(s, 0, ep, "wrong", caf::actor_cast<caf::actor>(f.self), 5s);
  REQUIRE_FALSE(p);
  CHECK(is(p.error(), errc::handshake_refused));
  CHECK(describe(p.error()).find(ep) != std::string::npos);
  CHECK(describe(p.error()).find("wrong data-plane key") != std::string::npos);
  CHECK(describe(p.error()).find("right") == std::string::npos);
  auto q = f.plane->connect(s, 7, ep, "right", caf::actor_cast<caf::actor>(f.self), 5s);
  REQUIRE_FALSE(q);
  CHECK(describe(q.error()).find("no shard 7 of this job is served here") != std::string::npos);
}

TEST_CASE("over TLS the data plane's frames are sealed, and pulls and pushes give the same answers") {
  temp_dir dir;
  REQUIRE(net::ensure_ca(dir.file("ca")));
  REQUIRE_FALSE(net::issue_node_cert(dir.file("ca"), dir.file("n"), "n", 30));
  auto tls = net::tls_context::load(dir.file("n"));
  REQUIRE(tls);
  fixture f;
  f.plane->use_tls(*tls);
  auto s = f.make("asp", 300000); // several sealed records per tensor
  auto proxy = f.connect(s, f.serve(s));
  REQUIRE_FALSE(f.join(s, 0));
  auto direct = f.pull(s, 0);
  auto through = f.pull(proxy, 0);
  REQUIRE(direct);
  REQUIRE(through);
  CHECK(through->params == direct->params);
  auto ack = f.push(proxy, 0, 0, wire::tensor(300000, 1.0f));
  REQUIRE(ack);
  CHECK(ack->version == 1);
  auto after = f.pull(s, 0);
  REQUIRE(after);
  CHECK(after->params[299999] == Approx(299999.0f - 1.0f));
  // A plain client (no credentials) does not get in.
  auto plain = std::make_shared<data_plane>(f.sys);
  auto p = plain->connect(s, 0, f.serve(s), "k1", caf::actor_cast<caf::actor>(f.self), 3s);
  REQUIRE_FALSE(p);
  CHECK(describe(p.error()).find("requires TLS") != std::string::npos);
  plain->stop();
}

TEST_CASE("connections to the data port that never prove the key hold no thread and are closed") {
  fixture f;
  auto s = f.make("asp", 8);
  auto ep = f.serve(s);
  auto port = static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
  auto threads = [] {
    std::ifstream in{"/proc/self/status"};
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("Threads:", 0) == 0)
        return std::stol(line.substr(8));
    return -1L;
  };
  const long before = threads();
  std::vector<net::tcp_socket> held;
  for (int i = 0; i < 100; ++i) {
    auto raw = net::connect_tcp("127.0.0.1", port, 2s);
    REQUIRE(raw);
    char a = 'A';
    iovec iov{&a, 1};
    REQUIRE_FALSE(raw->write_all(&iov, 1));
    held.push_back(std::move(*raw));
  }
  std::this_thread::sleep_for(300ms);
  CHECK(threads() <= before + 1);
  // A member still gets in at once.
  auto proxy = f.connect(s, ep);
  REQUIRE_FALSE(f.join(s, 0));
  CHECK(f.pull(proxy, 0));
  // Every half-open connection is closed by the deadline (5 s).
  int closed = 0;
  for (auto& h : held) {
    REQUIRE_FALSE(h.set_timeout(8s));
    char b;
    closed += h.read_exact(&b, 1) ? 1 : 0;
  }
  CHECK(closed == 100);
}

TEST_CASE("a request carrying more than the shard's range closes its connection before the tensor is read") {
  fixture f;
  auto s = f.make("asp", 8);
  auto ep = f.plane->serve(0, s, "k1", "127.0.0.1", 8);
  REQUIRE(ep);
  auto proxy = f.connect(s, *ep);
  REQUIRE_FALSE(f.join(s, 0));
  auto big = f.push(proxy, 0, 0, wire::tensor(4096, 1.0f));
  REQUIRE_FALSE(big);
  CHECK(is(big.error(), errc::peer_unreachable)); // the shard node closed the connection
  // The shard did not change, and a well-sized push works (over CAF from now on).
  auto direct = f.pull(s, 0);
  REQUIRE(direct);
  CHECK(direct->version == 0);
  CHECK(f.push(proxy, 0, 0, wire::tensor(8, 1.0f)));
}

TEST_CASE("an unreachable data endpoint fails within the timeout, naming the address") {
  fixture f;
  auto s = f.make("asp", 8);
  // Nothing listens on a port we just opened and closed.
  uint16_t port = 0;
  {
    auto l = net::tcp_listener::open("127.0.0.1", 0);
    REQUIRE(l);
    port = l->port();
  }
  auto ep = "127.0.0.1:" + std::to_string(port);
  auto p = f.plane->connect(s, 0, ep, "k", caf::actor_cast<caf::actor>(f.self), 2s);
  REQUIRE_FALSE(p);
  CHECK(is(p.error(), errc::peer_unreachable));
  CHECK(describe(p.error()).find(ep) != std::string::npos);
  auto bad = f.plane->connect(s, 0, "no-port-here", "k", caf::actor_cast<caf::actor>(f.self), 2s);
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), errc::invalid_argument));
}

TEST_CASE("garbage on the data port closes that connection only") {
  fixture f;
  auto s = f.make("asp", 8);
  auto ep = f.serve(s);
  auto port = static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
  auto raw = net::connect_tcp("127.0.0.1", port, 2s);
  REQUIRE(raw);
  char junk[64];
  std::memset(junk, 0x5a, sizeof junk);
  iovec iov{junk, sizeof junk};
  REQUIRE_FALSE(raw->write_all(&iov, 1));
  // The server answers with an error frame and closes.
  REQUIRE_FALSE(raw->set_timeout(5s));
  char buf[256];
  caf::error end;
  for (int i = 0; i < 100000 && !end; ++i)
    end = raw->read_exact(buf, 1);
  CHECK(end);
  // A well-behaved client is still served.
  auto proxy = f.connect(s, ep);
  REQUIRE_FALSE(f.join(s, 0));
  CHECK(f.pull(proxy, 0));
}

TEST_CASE("a stand-in quits with its shard's exit reason, so a worker monitoring it sees the loss") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  auto s = f.make("asp", 8);
  auto proxy = f.connect(s, f.serve(s));
  f.self->monitor(proxy);
  f.self->send_exit(s, caf::exit_reason::kill);
  caf::error reason;
  bool down = false;
  f.self->receive([&](caf::down_msg& dm) { down = true; reason = dm.reason; }, caf::after(5s) >> [] {});
  REQUIRE(down);
  CHECK(reason == caf::exit_reason::kill);
  // A request sent to it now fails at once, not after its timeout.
  auto late = f.pull(proxy, 0);
  CHECK_FALSE(late);
}

TEST_CASE("a stand-in quits when its owner does, and ends its connection") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  auto s = f.make("asp", 8);
  auto owner = f.sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  auto p = f.plane->connect(s, 0, f.serve(s), "k1", owner, 5s);
  REQUIRE(p);
  f.self->monitor(*p);
  for (int i = 0; i < 100 && f.plane->shared_memory_connections() != (shm ? 2u : 0u); ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(f.plane->shared_memory_connections() == (shm ? 2u : 0u));
  f.self->send_exit(owner, caf::exit_reason::user_shutdown);
  bool down = false;
  f.self->receive([&](caf::down_msg& dm) { down = dm.source == p->address(); }, caf::after(5s) >> [] {});
  CHECK(down);
  for (int i = 0; i < 200 && f.plane->shared_memory_connections() != 0; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(f.plane->shared_memory_connections() == 0);
}

TEST_CASE("a stand-in over shared memory that nobody holds any longer ends its connection") {
  fixture f;
  auto s = f.make("asp", 8);
  {
    auto proxy = f.connect(s, f.serve(s));
    REQUIRE(f.pull(proxy, 0));
    CHECK(f.plane->shared_memory_connections() == 2u);
  }
  for (int i = 0; i < 200 && f.plane->shared_memory_connections() != 0; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(f.plane->shared_memory_connections() == 0);
}

TEST_CASE("a stand-in over shared memory with as many requests unanswered as the shard's node reads ahead fails "
          "the next one at once, naming why") {
  fixture f;
  auto s = f.make("bsp", 4);
  auto proxy = f.connect(s, f.serve(s));
  REQUIRE_FALSE(f.join(s, 0));
  REQUIRE_FALSE(f.join(s, 1));
  REQUIRE(f.push(proxy, 0, 0, wire::tensor(4, 1.0f)));
  // Reads held until worker 1 pushes, 32 of them (requests a timeout gave up on look so).
  for (int i = 0; i < 32; ++i)
    f.self->send(proxy, wire::pull_request{0, 0, false});
  const auto t0 = std::chrono::steady_clock::now();
  auto next = f.pull(proxy, 0);
  REQUIRE_FALSE(next);
  CHECK(describe(next.error()).find("32 requests unanswered") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  // The round completes: the held reads are answered, and the connection goes on.
  REQUIRE(f.push(s, 1, 0, wire::tensor(4, 3.0f)));
  int answered = 0;
  for (int i = 0; i < 32; ++i)
    f.self->receive([&](const wire::pull_reply&) { ++answered; }, caf::after(5s) >> [] {});
  CHECK(answered == 32);
  auto later = f.pull(proxy, 0);
  REQUIRE(later);
  CHECK(later->version == 1);
}

TEST_CASE("a stand-in whose connection is lost answers the requests waiting on it with the loss and sends later "
          "ones over CAF") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  auto s = f.make("bsp", 4);
  auto proxy = f.connect(s, f.serve(s));
  REQUIRE_FALSE(f.join(s, 0));
  REQUIRE_FALSE(f.join(s, 1));
  REQUIRE(f.push(proxy, 0, 0, wire::tensor(4, 1.0f)));
  // A read held until worker 1 pushes: the shard node's data plane stops meanwhile.
  f.self->send(proxy, wire::pull_request{0, 0, false});
  std::this_thread::sleep_for(100ms);
  f.plane->stop();
  caf::error lost;
  bool replied = false;
  f.self->receive([&](const wire::pull_reply&) { replied = true; }, [&](caf::error& e) { lost = e; },
                  caf::after(5s) >> [] {});
  CHECK_FALSE(replied);
  INFO(describe(lost));
  CHECK(describe(lost).find("lost") != std::string::npos);
  // The shard is still there: the next pull goes to it over CAF.
  REQUIRE(f.push(s, 1, 0, wire::tensor(4, 3.0f)));
  auto later = f.pull(proxy, 0);
  REQUIRE(later);
  CHECK(later->version == 1);
}

TEST_CASE("a sparse push crosses the data plane with its indices and is applied at them") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  auto s = f.make("asp", 1000);
  auto proxy = f.connect(s, f.serve(s));
  REQUIRE_FALSE(f.join(proxy, 0));
  wire::push p{0, 0, 0, 1, wire::tensor{1.0f, 2.0f, 3.0f}};
  p.total = 1000;
  p.sparse = true;
  p.index = {0, 500, 999};
  expected<wire::push_ack> ack = caf::error{};
  f.self->request(proxy, 5s, p).receive([&](const wire::push_ack& a) { ack = a; },
                                        [&](caf::error& e) { ack = e; });
  INFO((ack ? std::string{} : describe(ack.error())));
  REQUIRE(ack);
  CHECK(ack->version == 1);
  auto after = f.pull(s, 0);
  REQUIRE(after);
  CHECK(after->params[0] == 0.0f - 1.0f);
  CHECK(after->params[500] == 500.0f - 2.0f);
  CHECK(after->params[999] == 999.0f - 3.0f);
  CHECK(after->params[1] == 1.0f);
  CHECK(after->params[998] == 998.0f);
}

TEST_CASE("a delta read crosses the data plane with its indices and values") {
  fixture f;
  auto s = f.make("asp", 1000);
  auto proxy = f.connect(s, f.serve(s));
  REQUIRE_FALSE(f.join(proxy, 0));
  auto read = [&](uint64_t view_seq) {
    wire::pull_request req{0, 0, false};
    req.topk_ratio = 0.002f; // 2 of 1000
    req.view_seq = view_seq;
    expected<wire::pull_reply> out = caf::error{};
    f.self->request(proxy, 5s, req).receive([&](wire::pull_reply& r) { out = std::move(r); },
                                            [&](caf::error& e) { out = e; });
    INFO((out ? std::string{} : describe(out.error())));
    REQUIRE(out);
    return *out;
  };
  auto dense = read(0);
  CHECK_FALSE(dense.sparse);
  CHECK(dense.params.size() == 1000);
  wire::tensor g(1000, 0.0f);
  g[10] = 1.0f;
  g[700] = -2.0f;
  g[5] = 0.5f;
  REQUIRE(f.push(proxy, 0, 0, g));
  auto delta = read(dense.view_seq);
  REQUIRE(delta.sparse);
  CHECK(delta.index == std::vector<uint32_t>{10, 700});
  CHECK(delta.params.to_vector() == std::vector<float>{10.0f - 1.0f, 700.0f + 2.0f});
  CHECK(delta.view_seq > dense.view_seq);
}

TEST_CASE("a shard node's tensors in flight are bounded over all its connections: a push past the budget waits "
          "for room, and a peer that trickles its tensor is closed at its deadline and gives its bytes back") {
  fixture f;
  const size_t n = 4096; // 16 KiB a push
  f.plane->limit_in_flight(20 << 10, 1s);
  auto s = f.make("asp", n);
  auto ep = f.serve(s);
  REQUIRE_FALSE(f.join(s, 0));
  // The trickler announces a whole push, sends 1 KiB of its tensor, and stalls.
  auto slow = admitted_client(ep, "k1");
  wire::push announced{0, 0, 0, 1, {}};
  auto meta = wire::encode(announced);
  struct {
    uint32_t magic = net::frame_magic;
    uint32_t kind = static_cast<uint32_t>(net::frame_kind::push);
    uint64_t seq = 1, meta_bytes = 0, payload_bytes = 0;
  } head;
  head.meta_bytes = meta.size() * sizeof(uint64_t);
  head.payload_bytes = n * sizeof(float);
  std::vector<float> part(256, 0.5f);
  iovec iov[3] = {{&head, sizeof head}, {meta.data(), head.meta_bytes}, {part.data(), part.size() * sizeof(float)}};
  REQUIRE_FALSE(slow.write_all(iov, 3));
  for (int i = 0; i < 50 && f.plane->in_flight_bytes() == 0; ++i)
    std::this_thread::sleep_for(20ms);
  CHECK(f.plane->in_flight_bytes() == n * sizeof(float));
  std::this_thread::sleep_for(300ms);
  // A well-behaved stand-in's push waits for the trickler's bytes, then goes through on
  // its own connection (it was not closed: the next push does not wait).
  auto proxy = f.connect(s, ep);
  const auto t0 = std::chrono::steady_clock::now();
  auto ack = f.push(proxy, 0, 0, wire::tensor(n, 1.0f));
  const auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE(ack);
  CHECK(ack->version == 1);
  CHECK(waited >= 400ms);
  char b;
  REQUIRE_FALSE(slow.set_timeout(5s));
  CHECK(slow.read_exact(&b, 1)); // the trickler's connection was closed
  const auto t1 = std::chrono::steady_clock::now();
  REQUIRE(f.push(proxy, 0, 1, wire::tensor(n, 1.0f)));
  CHECK(std::chrono::steady_clock::now() - t1 < 500ms);
  auto after = f.pull(s, 0);
  REQUIRE(after);
  CHECK(after->version == 2);
  CHECK(after->params[10] == Approx(10.0f - 2.0f)); // nothing of the trickler's half push applied
  for (int i = 0; i < 50 && f.plane->in_flight_bytes() != 0; ++i)
    std::this_thread::sleep_for(20ms);
  CHECK(f.plane->in_flight_bytes() == 0);
}

TEST_CASE("a node stopped while a connection waits for room in its budget stops at once, not at the wait's end") {
  fixture f;
  const size_t n = 4096; // 16 KiB a push
  f.plane->limit_in_flight(20 << 10); // the default grace: a wait of 30 s and more
  auto s = f.make("asp", n);
  auto ep = f.serve(s);
  REQUIRE_FALSE(f.join(s, 0));
  // Two peers announce a whole push each and send nothing of it: the first takes 16 KiB
  // of the 20, the second waits for room.
  auto announce = [&](net::tcp_socket& sock) {
    wire::push announced{0, 0, 0, 1, {}};
    auto meta = wire::encode(announced);
    struct {
      uint32_t magic = net::frame_magic;
      uint32_t kind = static_cast<uint32_t>(net::frame_kind::push);
      uint64_t seq = 1, meta_bytes = 0, payload_bytes = 0;
    } head;
    head.meta_bytes = meta.size() * sizeof(uint64_t);
    head.payload_bytes = n * sizeof(float);
    iovec iov[2] = {{&head, sizeof head}, {meta.data(), head.meta_bytes}};
    REQUIRE_FALSE(sock.write_all(iov, 2));
  };
  auto first = admitted_client(ep, "k1");
  announce(first);
  for (int i = 0; i < 50 && f.plane->in_flight_bytes() == 0; ++i)
    std::this_thread::sleep_for(20ms);
  REQUIRE(f.plane->in_flight_bytes() == n * sizeof(float));
  auto second = admitted_client(ep, "k1");
  announce(second);
  std::this_thread::sleep_for(300ms);
  const auto t0 = std::chrono::steady_clock::now();
  f.plane->stop();
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
}

namespace {

wire::ring_message chunk(uint64_t round, size_t n, float value) {
  wire::ring_message m;
  m.round = round;
  m.step = static_cast<uint32_t>(round % 4);
  m.chunk = 1;
  m.ring = 2;
  m.data = wire::tensor(n, value);
  return m;
}

}  // namespace

TEST_CASE("a ring's chunks reach the next worker's inbox through the data plane, in order, over shared memory and "
          "over TCP") {
  const bool shm = GENERATE(true, false);
  fixture f;
  f.plane->use_shared_memory(shm);
  caf::scoped_actor next{f.sys}; // the next worker on the ring
  auto ep = f.plane->listen("127.0.0.1");
  REQUIRE(ep);
  const size_t n = 100000; // 400 KB chunks: lent, not copied through the shared-memory ring
  f.plane->serve_ring(caf::actor_cast<caf::actor>(next), "k1", (n + 16) * sizeof(float));
  auto out = f.plane->connect_ring(caf::actor_cast<caf::actor>(next), *ep, "k1", caf::actor_cast<caf::actor>(f.self), 5s);
  INFO((out ? std::string{} : describe(out.error())));
  REQUIRE(out);
  CHECK(*out != caf::actor_cast<caf::actor>(next)); // a stand-in
  for (int i = 0; i < 100 && f.plane->shared_memory_connections() != (shm ? 2u : 0u); ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(f.plane->shared_memory_connections() == (shm ? 2u : 0u));
  for (uint64_t r = 0; r < 40; ++r)
    f.self->send(*out, chunk(r, r % 2 ? n : 3, static_cast<float>(r)));
  for (uint64_t r = 0; r < 40; ++r) {
    wire::ring_message got;
    bool came = false;
    next->receive([&](wire::ring_message& m) { got = std::move(m); came = true; }, caf::after(5s) >> [] {});
    REQUIRE(came);
    CHECK(got.round == r);
    CHECK(got.step == r % 4);
    CHECK(got.ring == 2);
    REQUIRE(got.data.size() == (r % 2 ? n : 3));
    CHECK(got.data.front() == static_cast<float>(r));
    CHECK(got.data.back() == static_cast<float>(r));
  }
  // A stand-in no longer wanted (the next worker changed) is stopped: its connection ends
  // at both ends, and the inbox's worker is not told of any break.
  f.self->send_exit(*out, caf::exit_reason::user_shutdown);
  if (shm) {
    for (int i = 0; i < 200 && f.plane->shared_memory_connections() != 0; ++i)
      std::this_thread::sleep_for(10ms);
    CHECK(f.plane->shared_memory_connections() == 0);
  }
  bool told = false;
  next->receive([&](ring_atom, const std::string&) { told = true; }, caf::after(300ms) >> [] {});
  CHECK_FALSE(told);
}

TEST_CASE("a ring connection to an inbox not served under the job's key is refused, naming what, and an inbox no "
          "longer served takes no new connection") {
  fixture f;
  caf::scoped_actor mine{f.sys}, theirs{f.sys};
  auto ep = f.plane->listen("127.0.0.1");
  REQUIRE(ep);
  f.plane->serve_ring(caf::actor_cast<caf::actor>(mine), "k1", 1 << 20);
  f.plane->serve_ring(caf::actor_cast<caf::actor>(theirs), "k2", 1 << 20); // another job's worker on this node
  auto owner = caf::actor_cast<caf::actor>(f.self);
  auto wrong_key = f.plane->connect_ring(caf::actor_cast<caf::actor>(mine), *ep, "k3", owner, 2s);
  REQUIRE_FALSE(wrong_key);
  CHECK(describe(wrong_key.error()).find("wrong data-plane key") != std::string::npos);
  CHECK(describe(wrong_key.error()).find(*ep) != std::string::npos);
  // The key of one job, the inbox of the other's worker.
  auto across = f.plane->connect_ring(caf::actor_cast<caf::actor>(theirs), *ep, "k1", owner, 2s);
  REQUIRE_FALSE(across);
  CHECK(describe(across.error()).find("no ring inbox of worker actor " + std::to_string(theirs->id())
                                      + " of this job is served here")
        != std::string::npos);
  f.plane->unserve_ring(mine->id());
  auto gone = f.plane->connect_ring(caf::actor_cast<caf::actor>(mine), *ep, "k1", owner, 2s);
  REQUIRE_FALSE(gone);
  // Nothing reached either inbox.
  bool any = false;
  mine->receive([&](wire::ring_message&) { any = true; }, caf::after(50ms) >> [] {});
  theirs->receive([&](wire::ring_message&) { any = true; }, caf::after(50ms) >> [] {});
  CHECK_FALSE(any);
}

TEST_CASE("a ring chunk larger than the inbox takes closes its connection unread and tells the inbox's worker, "
          "and the stand-in sends the chunks after it over CAF and, the next worker still there, tells its owner") {
  fixture f;
  f.plane->use_shared_memory(false);
  caf::scoped_actor next{f.sys};
  auto ep = f.plane->listen("127.0.0.1");
  REQUIRE(ep);
  f.plane->serve_ring(caf::actor_cast<caf::actor>(next), "k1", 64 * sizeof(float));
  auto out = f.plane->connect_ring(caf::actor_cast<caf::actor>(next), *ep, "k1", caf::actor_cast<caf::actor>(f.self), 5s);
  REQUIRE(out);
  f.self->send(*out, chunk(0, 65, 1.0f)); // one float too many: the reader closes the connection
  // The stand-in notices at a later write; from then on its chunks go over CAF.
  uint64_t last = 0;
  bool came = false;
  for (uint64_t r = 1; r <= 200 && !came; ++r) {
    f.self->send(*out, chunk(r, 8, 2.0f));
    next->receive(
      [&](wire::ring_message& m) {
        CHECK(m.data.size() == 8); // never the oversized one
        last = m.round;
        came = last > 0;
      },
      caf::after(20ms) >> [] {});
  }
  CHECK(came);
  CHECK(last >= 1);
  // The worker whose inbox it is hears why (a chunk may be lost: it leaves the ring).
  std::string why;
  next->receive([&](ring_atom, const std::string& w) { why = w; }, caf::after(2s) >> [] {});
  CHECK(why.find("closing the ring connection") != std::string::npos);
  CHECK(why.find("tensor payload of 260 bytes") != std::string::npos);
  // The stand-in's owner (the sending worker) too, once the next worker, still there after
  // the grace, was not heard to be gone: chunks written before the break may be lost.
  std::string owner_why;
  f.self->receive([&](ring_atom, const std::string& w) { owner_why = w; }, caf::after(15s) >> [] {});
  CHECK(owner_why.find("the ring connection to the next worker at " + *ep + " broke") != std::string::npos);
}
