// A node actor in this process, asked to serve a shard from a checkpoint store: a request
// it already served for the same job (the cluster asks again after its request timed out
// during a long restore) is answered with the shard it serves, not refused as busy.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "actors/cluster/node.hpp"
#include "actors/interfaces.hpp"
#include "runtime/core/error.hpp"
#include "../runtime/temp_dir.hpp"

using namespace ashlar;
using namespace ashlar::actors;
using namespace std::chrono_literals;

namespace {

struct config : caf::actor_system_config {
  config() { register_types(*this); }
};

struct answer {
  shard_actor shard;
  caf::error err;
};

answer ask(caf::scoped_actor& self, const node_actor& node, const wire::spawn_shard& req) {
  answer out;
  self->request(node, 30s, req)
    .receive([&](const shard_actor& s, const std::string&) { out.shard = s; },
             [&](caf::error& e) { out.err = std::move(e); });
  return out;
}

}  // namespace

TEST_CASE("a node asked again to serve a shard of the same job from its store answers with the shard it serves") {
  test::temp_dir dir; // (removed after the actor system has stopped every shard)
  config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  node_config nc;
  nc.name = "test-node";
  nc.roles = {wire::role::server};
  auto node = spawn_node(sys, nc);

  wire::spawn_shard req;
  req.range = shard_range{0, 0, 8};
  req.params = std::vector<float>(8, 0.5f);
  req.policy = "asp";
  req.lr = 0.1f;
  req.checkpoint_dir = dir.path();
  req.job = "a1b2c3d4";
  auto first = ask(self, node, req);
  REQUIRE_FALSE(first.err);
  REQUIRE(first.shard);

  // The cluster's request to serve it again (resume) for the same job: the same shard.
  auto again = req;
  again.resume = true;
  auto second = ask(self, node, again);
  REQUIRE_FALSE(second.err);
  CHECK(second.shard.address() == first.shard.address());

  // Another job's request (another learning rate) is not answered with it: the store
  // is held by the shard that runs, so the node refuses as busy.
  auto other = again;
  other.lr = 0.2f;
  auto refused = ask(self, node, other);
  REQUIRE(refused.err);
  CHECK(is(refused.err, errc::busy));
  CHECK_FALSE(refused.shard);

  // A later job with the same settings (resumed from the same store) is another job: not
  // answered with the earlier job's shard, which may be stopping.
  auto later = again;
  later.job = "e5f6a7b8";
  auto later_job = ask(self, node, later);
  REQUIRE(later_job.err);
  CHECK(is(later_job.err, errc::busy));
  CHECK_FALSE(later_job.shard);

  // Once that shard has written its stop record and stopped, the node restores a new one
  // from the store.
  self->request(first.shard, 10s, checkpoint_atom::value)
    .receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  self->monitor(first.shard);
  self->send_exit(first.shard, caf::exit_reason::kill);
  self->receive([](const caf::down_msg&) {}, caf::after(10s) >> [] { FAIL("the shard did not stop"); });
  answer restored;
  // The node may answer once more with the stopped shard, or find its store not yet let
  // go (busy), until it has seen the shard stop: asked again then, any other error fails.
  for (int i = 0; i < 200; ++i) {
    restored = ask(self, node, again);
    const bool settling = restored.err ? is(restored.err, errc::busy)
                                       : restored.shard.address() == first.shard.address();
    if (!settling)
      break;
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE_FALSE(restored.err);
  CHECK(restored.shard.address() != first.shard.address());
  wire::shard_status status;
  self->request(restored.shard, 10s, status_atom::value)
    .receive([&](const wire::shard_status& s) { status = s; }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(status.shard_id == 0);
  CHECK(status.begin == 0);
  CHECK(status.end == 8);
  self->send_exit(node, caf::exit_reason::user_shutdown);
}
