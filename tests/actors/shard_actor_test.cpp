#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include "actors/interfaces.hpp"
#include "actors/server_shard.hpp"
#include "held_push.hpp"
#include "../runtime/temp_dir.hpp"
#include "runtime/store/checkpoint.hpp"

using namespace ashlar;
using namespace ashlar::actors;
using namespace std::chrono_literals;

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

  shard_actor make(const std::string& policy, size_t n, double average_samples = 0) {
    auto p = make_policy(policy, {});
    REQUIRE(p);
    sgd_config opt;
    opt.lr = 1.0f;
    opt.momentum = 0.0f;
    opt.weight_decay = 0.0f;
    auto core = std::make_unique<shard_core>(shard_range{0, 0, n}, std::vector<float>(n, 0.0f), opt, std::move(*p));
    core->keep_average(average_samples);
    return spawn_shard(sys, std::move(core));
  }

  wire::pull_reply read(const shard_actor& s, wire::pull_request req) {
    wire::pull_reply out;
    self->request(s, 5s, req).receive([&](const wire::pull_reply& r) { out = r; },
                                      [](caf::error& e) { FAIL(describe(e)); });
    return out;
  }

  void join(const shard_actor& s, uint32_t w) {
    wire::membership_change m{wire::membership_change::join, w, ""};
    self->request(s, 5s, m).receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  }

  wire::push_ack push(const shard_actor& s, uint32_t w, uint64_t base, std::vector<float> g) {
    wire::push_ack out;
    self->request(s, 5s, wire::push{w, 0, base, 1, wire::tensor(g.begin(), g.end())})
      .receive([&](const wire::push_ack& a) { out = a; }, [](caf::error& e) { FAIL(describe(e)); });
    return out;
  }
};

}  // namespace

TEST_CASE("a BSP shard actor holds a pushed worker's read until the round is applied") {
  fixture f;
  auto s = f.make("bsp", 2);
  f.join(s, 0);
  f.join(s, 1);
  CHECK(f.push(s, 0, 0, {1, 1}).outcome == wire::push_ack::buffered);
  // Worker 0 asks for the next version: the shard must not answer yet.
  f.self->send(s, wire::pull_request{0, 0, false});
  bool early = false;
  f.self->receive([&](const wire::pull_reply&) { early = true; }, caf::after(200ms) >> [] {});
  CHECK_FALSE(early);
  // Worker 1's push completes the round and releases the held read with version 1.
  auto ack = f.push(s, 1, 0, {3, 3});
  CHECK(ack.version == 1);
  wire::pull_reply reply;
  f.self->receive([&](const wire::pull_reply& r) { reply = r; }, caf::after(5s) >> [] { FAIL("no reply"); });
  CHECK(reply.version == 1);
  CHECK(reply.params == wire::tensor{-2, -2});
  CHECK(reply.wait_ns > 0);
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a shard actor answers a push whose read follows after that read's reply, once the round is applied") {
  fixture f;
  auto s = f.make("bsp", 2);
  f.join(s, 0);
  f.join(s, 1);
  // Worker 0 pushes with its next read right behind: neither is answered before the round.
  test::push_then_read(f.self, s, wire::push{0, 0, 0, 1, wire::tensor{1, 1}});
  CHECK_FALSE(test::answered_within(f.self, 200ms));
  // Worker 1's push completes the round (acknowledged at once: no read follows it).
  auto ack = f.push(s, 1, 0, {3, 3});
  CHECK(ack.version == 1);
  auto order = test::next_answers(
    f.self,
    [](const wire::pull_reply& r) {
      CHECK(r.version == 1);
      CHECK(r.params == wire::tensor{-2, -2});
    },
    [](const wire::push_ack& a) {
      CHECK(a.outcome == wire::push_ack::buffered);
      CHECK(a.complete);
    });
  CHECK(order == std::vector<std::string>{"reply", "ack"});
  // A read that is allowed at once: its reply, then the push it followed.
  wire::push q{1, 0, 1, 1, wire::tensor{1, 1}};
  q.read_follows = true;
  f.self->send(s, q);
  f.push(s, 0, 1, {1, 1}); // the round of version 2 is applied
  f.self->send(s, wire::pull_request{1, 0, false});
  uint64_t version = 0;
  order = test::next_answers(
    f.self, [&](const wire::pull_reply& r) { version = r.version; }, [](const wire::push_ack&) {});
  CHECK(order == std::vector<std::string>{"reply", "ack"});
  CHECK(version == 2);
}

TEST_CASE("a shard actor answers a malformed push with an error and keeps serving") {
  fixture f;
  auto s = f.make("asp", 4);
  f.join(s, 0);
  caf::error got;
  f.self->request(s, 5s, wire::push{0, 0, 0, 1, {1, 2}})
    .receive([](const wire::push_ack&) { FAIL("accepted a short gradient"); },
             [&](caf::error& e) { got = e; });
  CHECK(is(got, errc::shape_mismatch));
  wire::shard_status st;
  f.self->request(s, 5s, status_atom::value).receive([&](const wire::shard_status& x) { st = x; },
                                                     [](caf::error& e) { FAIL(describe(e)); });
  CHECK(st.version == 0);
  CHECK(st.live_workers == std::vector<uint32_t>{0});
  CHECK(f.push(s, 0, 0, {1, 1, 1, 1}).version == 1);
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a worker leaving a BSP shard releases the others' held reads") {
  fixture f;
  auto s = f.make("bsp", 1);
  f.join(s, 0);
  f.join(s, 1);
  f.push(s, 0, 0, {1});
  f.self->send(s, wire::pull_request{0, 0, false});
  wire::membership_change leave{wire::membership_change::leave, 1, "done"};
  f.self->request(s, 5s, leave).receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  wire::pull_reply reply;
  f.self->receive([&](const wire::pull_reply& r) { reply = r; }, caf::after(5s) >> [] { FAIL("no reply"); });
  CHECK(reply.version == 1);
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a shard serves a large read in chunks of one version and assembles a chunked push") {
  fixture f;
  auto s = f.make("asp", 10);
  f.join(s, 0);
  // Read in chunks of 4: the first reply starts a read the later chunks name.
  wire::pull_reply first;
  f.self->request(s, 5s, wire::pull_request{0, 0, false, 0, 4, 0})
    .receive([&](const wire::pull_reply& r) { first = r; }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(first.params.size() == 4);
  CHECK(first.total == 10);
  REQUIRE(first.read_id != 0);
  // An update between chunks does not leak into the read.
  REQUIRE(f.push(s, 0, 0, std::vector<float>(10, 1.0f)).version == 1);
  std::vector<float> rest;
  for (uint64_t off : {4, 8})
    f.self->request(s, 5s, wire::pull_request{0, 0, false, off, 4, first.read_id})
      .receive([&](const wire::pull_reply& r) {
                 CHECK(r.version == 0);
                 CHECK(r.offset == off);
                 rest.insert(rest.end(), r.params.begin(), r.params.end());
               },
               [](caf::error& e) { FAIL(describe(e)); });
  CHECK(rest == std::vector<float>(6, 0.0f));
  // A push in three chunks is applied once, when its last chunk arrives.
  std::vector<wire::push_ack> acks;
  for (uint64_t off : {0, 4, 8}) {
    uint64_t len = off == 8 ? 2 : 4;
    f.self->request(s, 5s, wire::push{0, 0, 1, 1, wire::tensor(len, 2.0f), off, 10})
      .receive([&](const wire::push_ack& a) { acks.push_back(a); }, [](caf::error& e) { FAIL(describe(e)); });
  }
  REQUIRE(acks.size() == 3);
  CHECK_FALSE(acks[0].complete);
  CHECK_FALSE(acks[1].complete);
  CHECK(acks[2].complete);
  CHECK(acks[2].version == 2);
  // A chunk that claims another range length is refused.
  caf::error err;
  f.self->request(s, 5s, wire::push{0, 0, 2, 1, wire::tensor(4, 1.0f), 0, 12})
    .receive([](const wire::push_ack&) {}, [&](caf::error& e) { err = e; });
  CHECK(is(err, errc::shape_mismatch));
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a sparse push updates exactly its entries, like the dense push it stands for") {
  fixture f;
  auto sparse_shard = f.make("asp", 8);
  auto dense_shard = f.make("asp", 8);
  f.join(sparse_shard, 0);
  f.join(dense_shard, 0);
  wire::push p{0, 0, 0, 1, wire::tensor{0.5f, -2.0f}};
  p.total = 8;
  p.sparse = true;
  p.index = {1, 6};
  wire::push_ack ack;
  f.self->request(sparse_shard, 5s, p).receive([&](const wire::push_ack& a) { ack = a; },
                                               [](caf::error& e) { FAIL(describe(e)); });
  CHECK(ack.version == 1);
  CHECK(ack.outcome == wire::push_ack::applied);
  f.push(dense_shard, 0, 0, {0, 0.5f, 0, 0, 0, 0, -2.0f, 0});
  auto read = [&](const shard_actor& s) {
    std::vector<float> out;
    f.self->request(s, 5s, wire::pull_request{0, 0, true})
      .receive([&](const wire::pull_reply& r) { out = r.params.to_vector(); },
               [](caf::error& e) { FAIL(describe(e)); });
    return out;
  };
  auto got = read(sparse_shard);
  CHECK(got == read(dense_shard));
  CHECK(got == std::vector<float>{0, -0.5f, 0, 0, 0, 0, 2.0f, 0}); // lr 1
  // An index outside the range, or a sparse chunk, is refused naming what is wrong; the
  // shard keeps its version.
  for (auto bad : {std::make_pair(uint64_t{0}, std::vector<uint32_t>{1, 8}),
                   std::make_pair(uint64_t{4}, std::vector<uint32_t>{1, 2})}) {
    wire::push q = p;
    q.base_version = 1;
    q.offset = bad.first;
    q.index = bad.second;
    caf::error err;
    f.self->request(sparse_shard, 5s, q).receive([](const wire::push_ack&) { FAIL("accepted"); },
                                                 [&](caf::error& e) { err = e; });
    CHECK(is(err, errc::shape_mismatch));
    CHECK(describe(err).find("sparse push from worker 0") != std::string::npos);
  }
  CHECK(read(sparse_shard) == got);
  f.self->send_exit(sparse_shard, caf::exit_reason::user_shutdown);
  f.self->send_exit(dense_shard, caf::exit_reason::user_shutdown);
}

TEST_CASE("a shard answers a worker it keeps a view of with delta reads, and a stale view with a dense read") {
  fixture f;
  auto s = f.make("asp", 10);
  f.join(s, 0);
  auto pull = [&](uint64_t view_seq) {
    wire::pull_request req{0, 0, false};
    req.topk_ratio = 0.2f; // 2 of 10 entries
    req.view_seq = view_seq;
    wire::pull_reply out;
    f.self->request(s, 5s, req).receive([&](const wire::pull_reply& r) { out = r; },
                                        [](caf::error& e) { FAIL(describe(e)); });
    return out;
  };
  // No view yet: a dense read, which starts one.
  auto first = pull(0);
  CHECK_FALSE(first.sparse);
  CHECK(first.params.size() == 10);
  REQUIRE(first.view_seq != 0);
  // Three entries change (lr 1): the next read sends the two that changed most.
  f.push(s, 0, 0, {0, 0, -3.0f, 0, 0, 0, 0.5f, 0, 0, 1.0f});
  auto delta = pull(first.view_seq);
  REQUIRE(delta.sparse);
  CHECK(delta.version == 1);
  CHECK(delta.index == std::vector<uint32_t>{2, 9});
  CHECK(delta.params.to_vector() == std::vector<float>{3.0f, -1.0f});
  CHECK(delta.view_seq > first.view_seq);
  // The rest follows with the next read (k entries always: the other one unchanged).
  auto rest = pull(delta.view_seq);
  REQUIRE(rest.sparse);
  REQUIRE(rest.index.size() == 2);
  auto at6 = std::find(rest.index.begin(), rest.index.end(), 6u);
  REQUIRE(at6 != rest.index.end());
  CHECK(rest.params[static_cast<size_t>(at6 - rest.index.begin())] == -0.5f);
  // A worker that lost a reply still names the view before it: it gets a dense read.
  auto again = pull(delta.view_seq);
  CHECK_FALSE(again.sparse);
  CHECK(again.params.to_vector() == std::vector<float>{0, 0, 3.0f, 0, 0, 0, -0.5f, 0, 0, -1.0f});
  // A worker that leaves and joins again starts over too.
  wire::membership_change leave{wire::membership_change::leave, 0, "test"};
  f.self->request(s, 5s, leave).receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  f.join(s, 0);
  CHECK_FALSE(pull(again.view_seq).sparse);
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("only the job's members get a delta view: reads under invented worker ids get dense replies and no view") {
  fixture f;
  auto s = f.make("asp", 10);
  f.join(s, 0);
  auto pull = [&](uint32_t worker) {
    wire::pull_request req{worker, 0, false};
    req.topk_ratio = 0.2f;
    wire::pull_reply out;
    f.self->request(s, 5s, req).receive([&](const wire::pull_reply& r) { out = r; },
                                        [](caf::error& e) { FAIL(describe(e)); });
    return out;
  };
  for (uint32_t w = 100; w < 1100; ++w) {
    auto r = pull(w);
    REQUIRE(r.view_seq == 0); // no copy of the range kept for it
    REQUIRE_FALSE(r.sparse);
  }
  CHECK(pull(0).view_seq != 0); // the member does get one
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

namespace {

// A BSP shard's core over [0, 4), every parameter 0.5.
std::unique_ptr<shard_core> bsp_core_of_4() {
  auto p = make_policy("bsp", {});
  REQUIRE(p);
  return std::make_unique<shard_core>(shard_range{0, 0, 4}, std::vector<float>(4, 0.5f), sgd_config{}, std::move(*p));
}

}  // namespace

TEST_CASE("a shard told to start from the beginning (restore of cut 0) drops every cut and stop record it holds "
          "and keeps its initial parameters") {
  fixture f;
  test::temp_dir dir;
  auto core = bsp_core_of_4();
  auto persistence = open_shard_persistence(dir.path(), 3, false, *core);
  REQUIRE(persistence);
  auto store = persistence->store;
  auto s = spawn_shard(f.sys, std::move(core), *persistence);
  // A cut written now (in the background: wait until it is on disk).
  f.self->request(s, 5s, checkpoint_atom::value, uint64_t{1}, uint64_t{0}, uint64_t{0})
    .receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  std::vector<uint64_t> held;
  for (int i = 0; i < 100 && held.empty(); ++i) {
    f.self->request(s, 5s, checkpoint_atom::value, caf::get_atom::value)
      .receive([&](std::vector<uint64_t>& c) { held = c; }, [](caf::error& e) { FAIL(describe(e)); });
    if (held.empty())
      std::this_thread::sleep_for(20ms);
  }
  REQUIRE(held == std::vector<uint64_t>{1});
  f.self->request(s, 5s, restore_atom::value, uint64_t{0})
    .receive([](uint64_t v) { CHECK(v == 0); }, [](caf::error& e) { FAIL(describe(e)); });
  f.self->request(s, 5s, checkpoint_atom::value, caf::get_atom::value)
    .receive([&](std::vector<uint64_t>& c) { held = c; }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(held.empty());
  auto stored = store->keys("");
  REQUIRE(stored);
  CHECK(std::none_of(stored->begin(), stored->end(), [](const std::string& k) { return k.find("/c/") != std::string::npos; }));
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a shard ordered cut after cut keeps the job's last committed cut among the newest it writes, and a "
          "restore keeps the cut it went back to") {
  fixture f;
  test::temp_dir dir;
  auto core = bsp_core_of_4();
  auto persistence = open_shard_persistence(dir.path(), 2, false, *core); // keeps 2 cuts
  REQUIRE(persistence);
  auto s = spawn_shard(f.sys, std::move(core), *persistence);
  std::vector<uint64_t> held;
  auto write = [&](uint64_t cut, uint64_t committed) {
    f.self->request(s, 5s, checkpoint_atom::value, cut, uint64_t{0}, committed)
      .receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
    for (int i = 0; i < 200 && std::find(held.begin(), held.end(), cut) == held.end(); ++i) {
      f.self->request(s, 5s, checkpoint_atom::value, caf::get_atom::value)
        .receive([&](std::vector<uint64_t>& c) { held = c; }, [](caf::error& e) { FAIL(describe(e)); });
      if (std::find(held.begin(), held.end(), cut) == held.end())
        std::this_thread::sleep_for(10ms);
    }
  };
  write(1, 0);
  write(2, 1); // cut 1 committed; cuts 2 to 4 abandoned in turn
  write(3, 1);
  write(4, 1);
  CHECK(held == std::vector<uint64_t>{1, 3, 4});
  // Served again and taken back to cut 1: the next cuts keep it until the job commits one.
  f.self->request(s, 5s, restore_atom::value, uint64_t{1})
    .receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  held.clear();
  write(5, 0);
  write(6, 0);
  write(7, 0);
  CHECK(held == std::vector<uint64_t>{1, 6, 7});
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("an evaluation's snapshot reads the shard's running average, workers and other snapshots read the "
          "parameters") {
  fixture f;
  auto s = f.make("asp", 2, 1e9); // a half-life far beyond the samples: the average lags
  f.join(s, 0);
  for (uint64_t v = 0; v < 30; ++v)
    f.push(s, 0, v, {-1, 1}); // batch 1 each: the parameters walk to (30, -30)
  wire::pull_request worker{0, 0, false};
  CHECK(f.read(s, worker).params == wire::tensor{30, -30});
  wire::pull_request snap{0, 0, true};
  CHECK(f.read(s, snap).params == wire::tensor{30, -30});
  wire::pull_request eval{0, 0, true};
  eval.average = true;
  auto avg = f.read(s, eval);
  CHECK(avg.version == 30);
  REQUIRE(avg.params.size() == 2);
  // The half-life is a tenth of the samples applied: the average trails the parameters.
  CHECK(avg.params[0] > 15.0f);
  CHECK(avg.params[0] < 30.0f);
  CHECK(avg.params[1] == Approx(-avg.params[0]));
  // In chunks as well: one frozen copy of the average, whatever is pushed between them.
  eval.max_floats = 1;
  auto first = f.read(s, eval);
  CHECK(first.params == wire::tensor{avg.params[0]});
  REQUIRE(first.read_id != 0);
  f.push(s, 0, 30, {-1, 1});
  wire::pull_request next{0, 0, true, 1, 1, first.read_id};
  CHECK(f.read(s, next).params == wire::tensor{avg.params[1]});
  // A worker's read with the flag set (not a snapshot) gets the parameters.
  wire::pull_request flagged{0, 0, false};
  flagged.average = true;
  CHECK(f.read(s, flagged).params == wire::tensor{31, -31});
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a shard without a running average answers an average snapshot with its parameters") {
  fixture f;
  auto s = f.make("asp", 2);
  f.join(s, 0);
  f.push(s, 0, 0, {-1, 1});
  wire::pull_request eval{0, 0, true};
  eval.average = true;
  CHECK(f.read(s, eval).params == wire::tensor{1, -1});
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a checkpoint cut keeps the shard's running average: a restore of the cut, and a shard served again "
          "from its store, evaluate the average they had") {
  fixture f;
  test::temp_dir dir;
  auto make_core = [] {
    auto p = make_policy("asp", {});
    REQUIRE(p);
    sgd_config opt;
    opt.lr = 1.0f;
    opt.momentum = 0.0f;
    opt.weight_decay = 0.0f;
    auto core = std::make_unique<shard_core>(shard_range{0, 0, 2}, std::vector<float>(2, 0.0f), opt, std::move(*p));
    core->keep_average(1e9); // a half-life far beyond the samples: the average lags the parameters
    return core;
  };
  auto core = make_core();
  auto persistence = open_shard_persistence(dir.path(), 3, false, *core);
  REQUIRE(persistence);
  auto s = spawn_shard(f.sys, std::move(core), *persistence);
  f.join(s, 0);
  for (uint64_t v = 0; v < 20; ++v)
    f.push(s, 0, v, {-1, 1});
  wire::pull_request eval{0, 0, true};
  eval.average = true;
  const auto at_cut = f.read(s, eval).params;
  REQUIRE(at_cut.size() == 2);
  CHECK(at_cut[0] < 20.0f); // it lags the parameters (20, -20)
  auto wait_for_cut = [&](const shard_actor& a, uint64_t cut) {
    std::vector<uint64_t> held;
    for (int i = 0; i < 200 && std::find(held.begin(), held.end(), cut) == held.end(); ++i) {
      f.self->request(a, 5s, checkpoint_atom::value, caf::get_atom::value)
        .receive([&](std::vector<uint64_t>& c) { held = c; }, [](caf::error& e) { FAIL(describe(e)); });
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(std::find(held.begin(), held.end(), cut) != held.end());
  };
  f.self->request(s, 5s, checkpoint_atom::value, uint64_t{1}, uint64_t{0}, uint64_t{0})
    .receive([](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  wait_for_cut(s, 1);
  for (uint64_t v = 20; v < 40; ++v)
    f.push(s, 0, v, {-1, 1});
  CHECK(f.read(s, eval).params != at_cut);
  // Back to cut 1: the parameters of version 20 and the average as it was then.
  f.self->request(s, 5s, restore_atom::value, uint64_t{1})
    .receive([](uint64_t v) { CHECK(v == 20); }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(f.read(s, eval).params == at_cut);
  wire::pull_request worker{0, 0, false};
  CHECK(f.read(s, worker).params == wire::tensor{20, -20});
  // Its stop record, and a shard served again from the store (as a node does for a lost
  // shard): the average goes on from the record.
  f.push(s, 0, 20, {-1, 1});
  const auto at_stop = f.read(s, eval).params;
  f.self->request(s, 5s, checkpoint_atom::value).receive([](uint64_t v) { CHECK(v == 21); },
                                                         [](caf::error& e) { FAIL(describe(e)); });
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
  f.self->wait_for(s);
  persistence->store.reset(); // the store closes with its last holder
  auto again = make_core();
  auto reopened = open_shard_persistence(dir.path(), 3, true, *again);
  REQUIRE(reopened);
  CHECK(again->version() == 21);
  CHECK(again->average_copy()[0] == at_stop[0]);
  CHECK(again->average_copy()[1] == at_stop[1]);
  CHECK(again->average_samples() == 21); // 20 pushes of one sample to cut 1, then one more
  CHECK(again->params() == std::vector<float>{21, -21});
}
