// Two actor systems in one process: every message type crosses CAF's network layer and
// comes back intact (an unregistered type would arrive as an empty message).
#include <catch2/catch.hpp>

#include <caf/io/all.hpp>

#include "actors/cluster/network.hpp"
#include "actors/cluster/system.hpp"
#include "runtime/net/socket.hpp"

using namespace ashlar;
using namespace ashlar::actors;
using namespace std::chrono_literals;

namespace {

caf::behavior echo() {
  return {
    [](const wire::register_worker& x) { return x; }, [](const wire::assignment& x) { return x; },
    [](const wire::membership_change& x) { return x; }, [](const wire::pull_request& x) { return x; },
    [](const wire::pull_reply& x) { return x; }, [](const wire::push& x) { return x; },
    [](const wire::push_ack& x) { return x; }, [](const wire::shard_status& x) { return x; },
    [](const wire::profile_report& x) { return x; }, [](const wire::cluster_stats& x) { return x; },
    [](const wire::hello& x) { return x; }, [](const wire::welcome& x) { return x; },
    [](const wire::spawn_shard& x) { return x; }, [](const wire::spawn_worker& x) { return x; },
    [](const wire::job_request& x) { return x; }, [](const wire::job_result& x) { return x; },
    [](const wire::ctl_request& x) { return x; }, [](const wire::cluster_status& x) { return x; },
  };
}

template <class T>
T round_trip(caf::scoped_actor& self, const caf::actor& peer, const T& x) {
  T out;
  bool got = false;
  caf::error failure;
  // No assertion inside the handlers: a throwing handler would unwind through CAF.
  self->request(peer, 10s, x).receive(
    [&](const T& y) {
      out = y;
      got = true;
    },
    [&](caf::error& err) { failure = std::move(err); });
  INFO("round trip failed: " << describe(failure));
  REQUIRE(got);
  return out;
}

}  // namespace

TEST_CASE("every message type crosses the network between two actor systems and back") {
  cluster_system_config cfg_a, cfg_b;
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};
  net::net_security sec;
  sec.token = "round-trip";
  auto net_a = cluster_network::start(a, sec);
  auto net_b = cluster_network::start(b, sec);
  REQUIRE(net_a);
  REQUIRE(net_b);
  auto server = a.spawn(echo);
  auto port = (*net_a)->publish(a, server, endpoint{"127.0.0.1", 0});
  REQUIRE(port);
  auto ptr = connect(b, endpoint{"127.0.0.1", *port}, 10s);
  REQUIRE(ptr);
  auto peer = caf::actor_cast<caf::actor>(*ptr);
  REQUIRE(peer->node() != b.node()); // a real remote proxy: messages are serialized
  caf::scoped_actor self{b};

  CHECK(round_trip(self, peer, wire::register_worker{3, "h:1", "cpu"}).host == "h:1");
  wire::assignment asg;
  asg.shards = {{0, 0, 5}, {1, 5, 9}};
  asg.model.input = tensor_shape{4, 1, 1};
  asg.model.hidden = {3};
  asg.model.classes = 2;
  asg.policy = "asp";
  auto asg2 = round_trip(self, peer, asg);
  CHECK(asg2.shards == asg.shards);
  CHECK(asg2.policy == "asp");
  CHECK(round_trip(self, peer, wire::membership_change{wire::membership_change::fail, 4, "x"}).reason == "x");
  CHECK(round_trip(self, peer, wire::pull_request{1, 2, true}).snapshot);
  wire::tensor big(300000);
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<float>(i) * 0.5f;
  auto reply = round_trip(self, peer, wire::pull_reply{1, 7, 3, big, 11, 0, big.size(), 5});
  CHECK(reply.params == big);
  CHECK(reply.total == big.size());
  CHECK(reply.read_id == 5);
  auto chunk = round_trip(self, peer, wire::push{1, 2, 3, 4, big, 100, 900000});
  CHECK(chunk.grad == big);
  CHECK(chunk.offset == 100);
  CHECK(chunk.total == 900000);
  // A reply whose chunk claims more than its range is malformed: refused, not delivered.
  bool delivered = false;
  caf::error refused;
  self->request(peer, 10s, wire::pull_reply{1, 7, 3, big, 11, 10, 20, 0})
    .receive([&](const wire::pull_reply&) { delivered = true; }, [&](caf::error& e) { refused = e; });
  CHECK_FALSE(delivered);
  CHECK(refused);
  CHECK(round_trip(self, peer, wire::push_ack{1, 9, wire::push_ack::buffered, 2}).outcome == wire::push_ack::buffered);
  wire::shard_status ss;
  ss.end = 10;
  ss.live_workers = {1, 2};
  CHECK(round_trip(self, peer, ss).live_workers == ss.live_workers);
  CHECK(round_trip(self, peer, wire::profile_report{2, 3, 4, 0.25, 5, 6, 7, 8}).wait_ns == 8);
  wire::cluster_stats cs;
  cs.workers.resize(2);
  cs.workers[1].worker_id = 5;
  CHECK(round_trip(self, peer, cs).workers.at(1).worker_id == 5);
  wire::hello h;
  h.roles = {wire::role::server, wire::role::worker};
  CHECK(round_trip(self, peer, h).roles == h.roles);
  CHECK(round_trip(self, peer, wire::welcome{7, "c"}).node_id == 7);
  wire::spawn_shard sp;
  sp.range = {0, 0, 3};
  sp.params = {1, 2, 3};
  sp.policy = "bsp";
  CHECK(round_trip(self, peer, sp).params == sp.params);
  wire::spawn_worker sw;
  sw.data_dir = "/d";
  CHECK(round_trip(self, peer, sw).data_dir == "/d");
  wire::job_request jr;
  jr.settings = {{"train.workers", "3"}};
  CHECK(round_trip(self, peer, jr).settings == jr.settings);
  CHECK(round_trip(self, peer, wire::job_result{"{}"}).report_json == "{}");
  CHECK(round_trip(self, peer, wire::ctl_request{wire::ctl_request::add_worker, 0, 2}).count == 2);
  wire::cluster_status st;
  st.nodes.resize(1);
  st.nodes[0].name = "n";
  st.shards.push_back(ss);
  st.stage = "training";
  auto st2 = round_trip(self, peer, st);
  CHECK(st2.nodes.at(0).name == "n");
  CHECK(st2.shards.size() == 1);
  CHECK(st2.stage == "training");
  self->send_exit(server, caf::exit_reason::user_shutdown);
}

TEST_CASE("a probe tells a node that admits connections from one that refuses the token and one that never "
          "answers (a frozen process), within its timeout") {
  cluster_system_config cfg_a, cfg_b, cfg_c;
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};
  caf::actor_system c{cfg_c};
  net::net_security sec;
  sec.token = "probe-token";
  net::net_security other = sec;
  other.token = "another-token";
  auto net_a = cluster_network::start(a, sec);
  auto net_b = cluster_network::start(b, sec);
  auto net_c = cluster_network::start(c, other);
  REQUIRE(net_a);
  REQUIRE(net_b);
  REQUIRE(net_c);
  auto server = a.spawn(echo);
  auto port = (*net_a)->publish(a, server, endpoint{"127.0.0.1", 0});
  REQUIRE(port);
  const endpoint where{"127.0.0.1", *port};
  auto admitted = probe_admission(b, where, 2s);
  INFO(describe(admitted));
  CHECK_FALSE(admitted);
  auto refused = probe_admission(c, where, 2s);
  CHECK(is(refused, errc::handshake_refused));
  // A listening socket nobody accepts from: the kernel completes the TCP connection, no
  // handshake ever comes.
  auto silent = net::tcp_listener::open("127.0.0.1", 0);
  REQUIRE(silent);
  const auto start = std::chrono::steady_clock::now();
  auto frozen = probe_admission(b, endpoint{"127.0.0.1", silent->port()}, 500ms);
  CHECK(is(frozen, errc::peer_unreachable));
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(is(probe_admission(b, endpoint{"127.0.0.1", 1}, 500ms), errc::peer_unreachable));
  caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
}

// CAF 0.17.6 would name both systems by the host's hash and the process id, told apart only by
// its per-process counter in the last byte: two processes of one host would then differ by
// their pid alone, and a node that got the pid of one that died would be taken for it. Each
// system's name now hashes a fresh random string (actors/cluster/system.cpp).
TEST_CASE("actor systems get node ids whose host part is random, not the host's and a reused pid") {
  cluster_system_config ca, cb;
  caf::actor_system a{ca}, b{cb};
  const auto na = to_string(a.node()), nb = to_string(b.node());
  INFO(na << " / " << nb);
  REQUIRE(na.find('#') == 40);
  REQUIRE(nb.find('#') == 40);
  CHECK(na.substr(0, 38) != nb.substr(0, 38));
}
