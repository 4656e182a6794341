// The actors' protocols stepped message by message on CAF's deterministic test
// coordinator: no threads, no wall clock (timeouts fire when the test says), so each test
// asserts what an actor sends after each message it takes, not what a whole job reaches.
// Probes (scoped actors) stand in for workers; a scripted profiler and recording shards
// stand in for the scheduler's peers.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <caf/scheduler/test_coordinator.hpp>

#include "actors/cluster/cluster.hpp"
#include "actors/interfaces.hpp"
#include "actors/scheduler.hpp"
#include "actors/server_shard.hpp"
#include "actors/worker.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/policy/ashl.hpp"

using namespace ashlar;
using namespace ashlar::actors;
using namespace std::chrono_literals;

namespace {

struct stepped_config : caf::actor_system_config {
  stepped_config() {
    register_types(*this);
    set("scheduler.policy", caf::atom("testing"));
    set("logger.file-verbosity", caf::atom("quiet"));
  }
};

struct stepped {
  stepped_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());

  // Lets every actor finish: what is queued is taken and what is pending fires (the
  // actors were told to exit, or no handle to them is left).
  ~stepped() {
    for (int i = 0; i < 1000 && (sched.run() > 0 || sched.trigger_timeouts() > 0); ++i) {
    }
  }

  // Lets actors take messages until none has any left.
  size_t run() { return sched.run(); }

  // Lets one actor take one message; false if no actor had one.
  bool step() { return sched.try_run_once(); }
};

// Takes the next message of type T from a probe's mailbox, if one is there now.
template <class T>
std::optional<T> take(caf::scoped_actor& probe) {
  std::optional<T> out;
  probe->receive([&](const T& x) { out = x; }, caf::after(std::chrono::seconds(0)) >> [] {});
  return out;
}

// True if a probe's mailbox is empty.
bool idle(caf::scoped_actor& probe) {
  return probe->mailbox().empty();
}

shard_actor make_shard(caf::actor_system& sys, const std::string& policy, size_t n) {
  auto p = make_policy(policy, {});
  REQUIRE(p);
  sgd_config opt;
  opt.lr = 1.0f;
  opt.momentum = 0.0f;
  opt.weight_decay = 0.0f;
  return spawn_shard(sys, std::make_unique<shard_core>(shard_range{0, 0, n}, std::vector<float>(n, 0.0f), opt,
                                                       std::move(*p)));
}

}  // namespace

TEST_CASE("protocol: a BSP round on a shard, message by message") {
  stepped t;
  auto shard = make_shard(t.sys, "bsp", 2);
  caf::scoped_actor w0{t.sys}, w1{t.sys};
  w0->send(shard, wire::membership_change{wire::membership_change::join, 0, ""});
  w1->send(shard, wire::membership_change{wire::membership_change::join, 1, ""});
  t.run();
  REQUIRE(take<uint64_t>(w0));
  REQUIRE(take<uint64_t>(w1));
  // Worker 0 pushes: buffered for the round. Its next read is held.
  w0->send(shard, wire::push{0, 0, 0, 1, wire::tensor{1, 1}});
  REQUIRE(t.step());
  auto ack = take<wire::push_ack>(w0);
  REQUIRE(ack);
  CHECK(ack->outcome == wire::push_ack::buffered);
  w0->send(shard, wire::pull_request{0, 0, false});
  REQUIRE(t.step());
  CHECK(idle(w0)); // held until the round completes
  CHECK_FALSE(t.step()); // and nothing else is pending
  // Worker 1's push completes the round: its ack and worker 0's held read, both version 1.
  w1->send(shard, wire::push{1, 0, 0, 1, wire::tensor{3, 3}});
  REQUIRE(t.step());
  auto ack1 = take<wire::push_ack>(w1);
  REQUIRE(ack1);
  CHECK(ack1->version == 1);
  auto reply = take<wire::pull_reply>(w0);
  REQUIRE(reply);
  CHECK(reply->version == 1);
  CHECK(reply->params == wire::tensor{-2, -2}); // the mean of the round's gradients, lr 1
}

TEST_CASE("protocol: a chunked push is acknowledged chunk by chunk and applied once whole") {
  stepped t;
  auto shard = make_shard(t.sys, "asp", 4);
  caf::scoped_actor w{t.sys};
  w->send(shard, wire::membership_change{wire::membership_change::join, 0, ""});
  t.run();
  REQUIRE(take<uint64_t>(w));
  // The first half: acknowledged as a part, nothing applied.
  wire::push first{0, 0, 0, 1, wire::tensor{1, 2}};
  first.offset = 0;
  first.total = 4;
  w->send(shard, first);
  REQUIRE(t.step());
  auto a = take<wire::push_ack>(w);
  REQUIRE(a);
  CHECK_FALSE(a->complete);
  CHECK(a->version == 0);
  // The second half completes the push: one version, every entry updated.
  wire::push second{0, 0, 0, 1, wire::tensor{3, 4}};
  second.offset = 2;
  second.total = 4;
  w->send(shard, second);
  REQUIRE(t.step());
  auto b = take<wire::push_ack>(w);
  REQUIRE(b);
  CHECK(b->complete);
  CHECK(b->version == 1);
  w->send(shard, wire::pull_request{0, 0, true});
  REQUIRE(t.step());
  auto r = take<wire::pull_reply>(w);
  REQUIRE(r);
  CHECK(r->params == wire::tensor{-1, -2, -3, -4});
}

namespace {

// What the recording shards and the scripted profiler saw, and what the profiler says.
struct script {
  std::vector<std::pair<uint64_t, float>> bounds; // bound_atom messages, all shards
  std::vector<uint32_t> joins;                   // membership joins, all shards
  std::vector<uint32_t> fails;                   // membership failures, all shards
  wire::cluster_stats stats;                     // the profiler's answer to get
  std::map<uint32_t, uint64_t> taken;            // pushes of each worker the shards took
};

// silent: a shard whose node stopped answering (frozen, or its connection gone): it takes
// every membership change and never acknowledges one.
shard_actor recording_shard(caf::actor_system& sys, std::shared_ptr<script> s, bool silent = false) {
  return sys.spawn([s, silent](shard_actor::pointer self) -> shard_actor::behavior_type {
    return {
      [](const wire::pull_request&) -> wire::pull_reply { return {}; },
      [](const wire::push&) -> wire::push_ack { return {}; },
      [s, silent, self](const wire::membership_change& m) -> caf::result<uint64_t> {
        if (silent)
          return self->make_response_promise<uint64_t>(); // never delivered
        if (m.kind == wire::membership_change::join)
          s->joins.push_back(m.worker_id);
        if (m.kind == wire::membership_change::fail)
          s->fails.push_back(m.worker_id);
        return s->taken[m.worker_id];
      },
      [](status_atom) -> wire::shard_status { return {}; },
      [](tune_atom, uint32_t, bool) {},
      [s](bound_atom, uint64_t gap, float lr) { s->bounds.emplace_back(gap, lr); },
      [](lr_atom, float) {},
      [](checkpoint_atom, uint64_t, uint64_t, uint64_t) -> uint64_t { return 0; },
      [](checkpoint_atom, caf::get_atom) { return std::vector<uint64_t>{}; },
      [](restore_atom, uint64_t) -> uint64_t { return 0; },
      [](restore_atom, const std::vector<float>&) -> uint64_t { return 0; },
      [](checkpoint_atom) -> uint64_t { return 0; },
    };
  });
}

profiler_actor scripted_profiler(caf::actor_system& sys, std::shared_ptr<script> s) {
  return sys.spawn([s](profiler_actor::pointer) -> profiler_actor::behavior_type {
    return {
      [](const wire::profile_report&) {},
      [](const wire::membership_change&, const caf::actor_addr&) -> caf::ok_atom { return caf::ok_atom::value; },
      [s](caf::get_atom) -> wire::cluster_stats { return s->stats; },
    };
  });
}

// Records each (finished, failed) the scheduler reports when the job is done.
caf::actor done_observer(caf::actor_system& sys, std::shared_ptr<std::vector<std::pair<uint32_t, uint32_t>>> ended) {
  return sys.spawn([ended](caf::event_based_actor*) -> caf::behavior {
    return {[ended](done_atom, uint32_t finished, uint32_t failed, const std::string&, const std::string&) {
      ended->emplace_back(finished, failed);
    }};
  });
}

// A scheduler for `policy` with `n` expected workers, two recording shards and the
// scripted profiler.
struct scheduler_rig {
  stepped t;
  std::shared_ptr<script> s = std::make_shared<script>();
  std::vector<shard_actor> shards;
  profiler_actor profiler;
  scheduler_actor scheduler;

  // silent_second: shard 1 never acknowledges a membership change (recording_shard).
  // tweak: changes to the scheduler's configuration (observer, worker_wait).
  scheduler_rig(const std::string& policy, uint32_t n, bool silent_second = false,
                const std::function<void(scheduler_config&)>& tweak = {}) {
    scheduler_config sc;
    sc.job.policy = policy;
    sc.job.workers = n;
    sc.job.batch_size = 10;
    sc.job.epochs = 1;
    sc.train_size = 1000;
    sc.ranges = {shard_range{0, 0, 50}, shard_range{1, 50, 100}};
    shards = {recording_shard(t.sys, s), recording_shard(t.sys, s, silent_second)};
    sc.shards = shards;
    sc.profiler = scripted_profiler(t.sys, s);
    profiler = sc.profiler;
    if (tweak)
      tweak(sc);
    scheduler = spawn_scheduler(t.sys, sc);
  }

  ~scheduler_rig() {
    for (const auto& s : shards)
      caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(profiler, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
  }

  // Each probe registers; returns the assignments in probe order once all are answered.
  std::vector<wire::assignment> register_all(std::vector<caf::scoped_actor*> probes) {
    for (auto* p : probes)
      (*p)->send(scheduler, wire::register_worker{});
    t.run();
    std::vector<wire::assignment> out;
    for (auto* p : probes) {
      std::optional<wire::assignment> a;
      (*p)->receive([&](const wire::assignment& x, const std::vector<shard_actor>&) { a = x; },
                    caf::after(std::chrono::seconds(0)) >> [] {});
      REQUIRE(a);
      out.push_back(*a);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("protocol: the scheduler answers registrations only once every expected worker joined") {
  scheduler_rig rig("bsp", 2);
  caf::scoped_actor w0{rig.t.sys}, w1{rig.t.sys};
  w0->send(rig.scheduler, wire::register_worker{});
  rig.t.run();
  CHECK(idle(w0)); // the start barrier holds the first worker
  CHECK(rig.s->joins == std::vector<uint32_t>{0, 0}); // both shards know it already
  w1->send(rig.scheduler, wire::register_worker{});
  rig.t.run();
  std::vector<uint64_t> begins;
  for (auto* w : {&w0, &w1})
    (*w)->receive([&](const wire::assignment& a, const std::vector<shard_actor>& shards) {
                    CHECK(shards.size() == 2);
                    begins.push_back(a.data_begin);
                  },
                  caf::after(std::chrono::seconds(0)) >> [] { FAIL("no assignment"); });
  CHECK(begins == std::vector<uint64_t>{0, 500}); // fixed data slots by id
}

TEST_CASE("protocol: an ASHL stage change goes to every shard and every worker at the tick that sees it") {
  scheduler_rig rig("ashl", 2);
  caf::scoped_actor w0{rig.t.sys}, w1{rig.t.sys};
  auto as = rig.register_all({&w0, &w1});
  REQUIRE(as.size() == 2);
  // Training started: the shards got profiling's bound (AHL's gap: nobody waits for the
  // slowest while its steps are timed).
  REQUIRE(rig.s->bounds.size() == 2);
  const ashl_config defaults;
  CHECK(rig.s->bounds[0].first == defaults.ahl_gap);
  // A tick while the workers are short of their profile: no stage change.
  rig.s->stats.elapsed_seconds = 0.5;
  rig.s->stats.loss = 2.0;
  rig.s->stats.workers = {wire::worker_stats{}, wire::worker_stats{}};
  for (uint32_t i = 0; i < 2; ++i) {
    auto& w = rig.s->stats.workers[i];
    w.worker_id = i;
    w.steps = defaults.profile_steps - 1;
    w.compute_seconds = i == 0 ? 0.04 : 0.01; // worker 1 is 4x faster
    w.step_seconds = w.compute_seconds + 0.005;
    w.compute_per_sample = w.compute_seconds / 10;
  }
  REQUIRE(rig.t.sched.trigger_timeout()); // the first tick (200 ms after the start)
  rig.t.run();
  for (auto* w : {&w0, &w1}) { // one local step per commit while profiling, no stage
    bool one = false;
    (*w)->receive([&](local_steps_atom, uint32_t h) { one = h == 1; },
                  caf::after(std::chrono::seconds(0)) >> [] {});
    CHECK(one);
    CHECK(idle(*w));
  }
  CHECK(rig.s->bounds.size() == 2);
  // The next tick sees every worker profiled: AHL, to each shard and each worker.
  for (auto& w : rig.s->stats.workers)
    w.steps = defaults.profile_steps;
  rig.s->stats.elapsed_seconds = 1.0;
  REQUIRE(rig.t.sched.trigger_timeout());
  rig.t.run();
  REQUIRE(rig.s->bounds.size() == 4);
  CHECK(rig.s->bounds[2].first == defaults.ahl_gap);
  CHECK(rig.s->bounds[3].first == defaults.ahl_gap);
  std::map<int, uint32_t> local_steps;
  for (auto* w : {&w0, &w1}) {
    bool got = false;
    (*w)->receive(
      [&](stage_atom, const std::string& stage, uint32_t h, float lr, float) {
        CHECK(stage == "ahl");
        CHECK(lr == 1.0f);
        local_steps[w == &w0 ? 0 : 1] = h;
        got = true;
      },
      caf::after(std::chrono::seconds(0)) >> [] {});
    CHECK(got);
  }
  CHECK(local_steps[1] > local_steps[0]); // the fast worker commits less often
}

TEST_CASE("protocol: a shard served again learns the live workers before they learn it") {
  scheduler_rig rig("bsp", 2);
  caf::scoped_actor w0{rig.t.sys}, w1{rig.t.sys};
  rig.register_all({&w0, &w1});
  auto before = rig.s->joins.size();
  auto replacement = recording_shard(rig.t.sys, rig.s);
  caf::scoped_actor driver{rig.t.sys};
  driver->send(rig.scheduler, shard_atom::value, uint32_t{1}, replacement, std::string{"10.0.0.9:7000"});
  // One message: the scheduler asks the new shard to take each live worker; nobody is
  // told of it yet.
  REQUIRE(rig.t.step());
  CHECK(idle(w0));
  CHECK(idle(w1));
  rig.t.run();
  CHECK(rig.s->joins.size() == before + 2);
  for (auto* w : {&w0, &w1}) {
    bool told = false;
    (*w)->receive(
      [&](shard_atom, uint32_t index, const shard_actor& s, const std::string& endpoint) {
        CHECK(index == 1);
        CHECK(s == replacement);
        CHECK(endpoint == "10.0.0.9:7000");
        told = true;
      },
      caf::after(std::chrono::seconds(0)) >> [] {});
    CHECK(told);
  }
}

TEST_CASE("protocol: a lost shard holds up no registration, and learns the worker when it is served again") {
  scheduler_rig rig("bsp", 1, true);
  caf::scoped_actor w0{rig.t.sys};
  w0->send(rig.scheduler, wire::register_worker{});
  rig.t.run();
  // Shard 1 has not acknowledged the worker: the registration waits for it.
  CHECK(idle(w0));
  CHECK(rig.s->joins == std::vector<uint32_t>{0});
  // Its node is lost: the registration goes on without it (before, it waited for the
  // acknowledgement's 30 s timeout and then failed the worker).
  caf::anon_send_exit(rig.shards[1], caf::exit_reason::kill);
  rig.t.run();
  bool assigned = false;
  w0->receive([&](const wire::assignment&, const std::vector<shard_actor>&) { assigned = true; },
              [&](caf::error& err) { FAIL("registration failed: " << describe(err)); },
              caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(assigned);
  // A second worker registering while the shard is still lost is not held up either.
  caf::scoped_actor w1{rig.t.sys};
  w1->send(rig.scheduler, wire::register_worker{});
  rig.t.run();
  CHECK(rig.s->joins == std::vector<uint32_t>{0, 1});
  bool second = false;
  w1->receive([&](const wire::assignment&, const std::vector<shard_actor>&) { second = true; },
              [&](caf::error& err) { FAIL("registration failed: " << describe(err)); },
              caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(second);
  // Served again: the replacement learns both live workers.
  auto replacement = recording_shard(rig.t.sys, rig.s);
  caf::scoped_actor driver{rig.t.sys};
  driver->send(rig.scheduler, shard_atom::value, uint32_t{1}, replacement, std::string{"10.0.0.9:7000"});
  rig.t.run();
  CHECK(rig.s->joins == std::vector<uint32_t>{0, 1, 0, 1});
}

TEST_CASE("protocol: with every worker lost at once, the job waits for a newcomer, which takes up what they left") {
  auto ended = std::make_shared<std::vector<std::pair<uint32_t, uint32_t>>>();
  scheduler_rig rig("bsp", 2, false, [&](scheduler_config& sc) {
    sc.worker_wait = std::chrono::seconds(60);
    sc.observer = done_observer(sc.profiler->home_system(), ended);
  });
  std::vector<wire::assignment> as;
  {
    caf::scoped_actor w0{rig.t.sys}, w1{rig.t.sys};
    as = rig.register_all({&w0, &w1});
    REQUIRE(as.size() == 2);
    REQUIRE(as[0].steps > 10);
    rig.s->stats.workers = {wire::worker_stats{}, wire::worker_stats{}};
    rig.s->stats.workers[0].worker_id = 0;
    rig.s->stats.workers[0].steps = 4;
    rig.s->stats.workers[1].worker_id = 1;
    rig.s->stats.workers[1].steps = 6;
  } // both workers' actors end: their nodes are lost
  rig.t.run();
  CHECK(ended->empty()); // not done: their steps wait for a newcomer
  caf::scoped_actor w2{rig.t.sys};
  auto more = rig.register_all({&w2});
  REQUIRE(more.size() == 1);
  // Lockstep: it trains what both left, once: their untrained samples over its batch.
  const uint64_t owed = (as[0].steps - 4) * as[0].batch_size + (as[1].steps - 6) * as[1].batch_size;
  CHECK(more[0].steps == (owed + more[0].batch_size - 1) / more[0].batch_size);
  // It trains them and leaves: the job is done, the lost workers' steps taken up.
  rig.s->stats.workers.push_back(wire::worker_stats{});
  rig.s->stats.workers.back().worker_id = more[0].worker_id;
  rig.s->stats.workers.back().steps = more[0].steps;
  wire::membership_change leave;
  leave.kind = wire::membership_change::leave;
  leave.worker_id = more[0].worker_id;
  w2->send(rig.scheduler, leave);
  rig.t.run();
  using ends = std::vector<std::pair<uint32_t, uint32_t>>;
  CHECK(*ended == ends{{1, 2}}); // 1 finished, 2 failed
}

// A BSP worker lost while it waited for its round had pushed that round's step: the shards
// took it (and apply it), though the profiler, which hears of a step after its pull, has not
// counted it. What is handed over is what is left after the shards' count, not the profiler's.
TEST_CASE("protocol: a lost lockstep worker's last step, pushed before it was lost, is not handed over again") {
  auto ended = std::make_shared<std::vector<std::pair<uint32_t, uint32_t>>>();
  scheduler_rig rig("bsp", 2, false, [&](scheduler_config& sc) {
    sc.worker_wait = std::chrono::seconds(60);
    sc.observer = done_observer(sc.profiler->home_system(), ended);
  });
  std::vector<wire::assignment> as;
  {
    caf::scoped_actor w0{rig.t.sys}, w1{rig.t.sys};
    as = rig.register_all({&w0, &w1});
    REQUIRE(as.size() == 2);
    rig.s->stats.workers = {wire::worker_stats{}, wire::worker_stats{}};
    rig.s->stats.workers[0].worker_id = 0;
    rig.s->stats.workers[0].steps = 4; // the profiler's count: a round behind
    rig.s->stats.workers[1].worker_id = 1;
    rig.s->stats.workers[1].steps = 4;
    rig.s->taken = {{0, 5}, {1, 5}}; // both pushed their fifth step before they were lost
  }
  rig.t.run();
  caf::scoped_actor w2{rig.t.sys};
  auto more = rig.register_all({&w2});
  REQUIRE(more.size() == 1);
  const uint64_t owed = (as[0].steps - 5) * as[0].batch_size + (as[1].steps - 5) * as[1].batch_size;
  CHECK(more[0].steps == (owed + more[0].batch_size - 1) / more[0].batch_size);
}

TEST_CASE("protocol: a worker whose own computation failed fails the job, naming it, and the others are stopped") {
  auto errors = std::make_shared<std::vector<std::string>>();
  scheduler_rig rig("bsp", 1, false, [&](scheduler_config& sc) {
    sc.observer = sc.profiler->home_system().spawn([errors](caf::event_based_actor*) -> caf::behavior {
      return {[errors](done_atom, uint32_t, uint32_t, const std::string&, const std::string& job_error) {
        errors->push_back(job_error);
      }};
    });
  });
  caf::scoped_actor w0{rig.t.sys}, w1{rig.t.sys};
  auto as = rig.register_all({&w0, &w1});
  REQUIRE(as.size() == 2);
  wire::membership_change raised;
  raised.kind = wire::membership_change::error;
  raised.worker_id = as[0].worker_id;
  raised.reason = "step 3: invalid_state: Bridge.train_step raised the worker script raised ValueError: bad batch";
  w0->send(rig.scheduler, raised);
  rig.t.run();
  bool stopped = false;
  w1->receive([&](stop_atom) { stopped = true; }, caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(stopped);
  CHECK(errors->empty()); // worker 1 still finishes its step
  wire::membership_change leave;
  leave.kind = wire::membership_change::leave;
  leave.worker_id = as[1].worker_id;
  leave.early = true;
  leave.reason = std::string{wire::stopped_on_request};
  w1->send(rig.scheduler, leave);
  rig.t.run();
  REQUIRE(errors->size() == 1);
  CHECK(errors->front().find("worker " + std::to_string(as[0].worker_id) + "'s computation failed") == 0);
  CHECK(errors->front().find("ValueError: bad batch") != std::string::npos);
}

TEST_CASE("protocol: a node the cluster lost takes its workers with it, though no worker's own loss came") {
  // A node killed while its connections were set up may never report its workers' ends:
  // the cluster's (nodes_atom, name) is what tells the scheduler.
  scheduler_rig rig("bsp", 2);
  caf::scoped_actor w0{rig.t.sys}, w1{rig.t.sys};
  wire::register_worker on_a, on_b;
  on_a.host = "node-a";
  on_b.host = "node-b";
  w0->send(rig.scheduler, on_a);
  w1->send(rig.scheduler, on_b);
  rig.t.run();
  std::vector<uint32_t> ids;
  for (auto* w : {&w0, &w1})
    (*w)->receive([&](const wire::assignment& a, const std::vector<shard_actor>&) { ids.push_back(a.worker_id); },
                  caf::after(std::chrono::seconds(0)) >> [] { FAIL("no assignment"); });
  REQUIRE(ids.size() == 2);
  caf::scoped_actor cluster{rig.t.sys};
  cluster->send(rig.scheduler, nodes_atom::value, std::string{"node-a"});
  rig.t.run();
  CHECK(rig.s->fails == std::vector<uint32_t>{ids[0], ids[0]}); // both shards, worker 0 only
  cluster->send(rig.scheduler, nodes_atom::value, std::string{"node-a"}); // lost once
  cluster->send(rig.scheduler, nodes_atom::value, std::string{"node-c"}); // hosts none
  rig.t.run();
  CHECK(rig.s->fails.size() == 2);
}

TEST_CASE("protocol: with every worker lost and none joining within the wait, the job ends") {
  auto ended = std::make_shared<std::vector<std::pair<uint32_t, uint32_t>>>();
  scheduler_rig rig("bsp", 1, false, [&](scheduler_config& sc) {
    sc.worker_wait = std::chrono::seconds(60);
    sc.observer = done_observer(sc.profiler->home_system(), ended);
  });
  {
    caf::scoped_actor w0{rig.t.sys};
    rig.register_all({&w0});
    rig.s->stats.workers = {wire::worker_stats{}}; // worker 0 trained none of its steps
  }
  rig.t.run();
  CHECK(ended->empty());
  // The roster reads the actor system's clock, which here is the test's: the 60 s wait runs
  // out as the test triggers the timers due (the ticks, then the wait's own), without sleeping.
  int ticks = 0;
  for (; ticks < 1000 && ended->empty(); ++ticks) {
    rig.t.sched.trigger_timeout();
    rig.t.run();
  }
  INFO("timeouts triggered: " << ticks);
  CHECK(ticks > 1); // not at the first: the wait is 60 s of the test's clock
  using ends = std::vector<std::pair<uint32_t, uint32_t>>;
  CHECK(*ended == ends{{0, 1}});
}

namespace {

// What a worker under test told its (fake) scheduler and profiler.
struct worker_log {
  std::vector<wire::profile_report> reports;
  std::vector<wire::membership_change> leaves;
};

profiler_actor recording_profiler(caf::actor_system& sys, std::shared_ptr<worker_log> log) {
  return sys.spawn([log](profiler_actor::pointer) -> profiler_actor::behavior_type {
    return {
      [log](const wire::profile_report& r) { log->reports.push_back(r); },
      [](const wire::membership_change&, const caf::actor_addr&) -> caf::ok_atom { return caf::ok_atom::value; },
      [](caf::get_atom) -> wire::cluster_stats { return {}; },
    };
  });
}

// A scheduler that assigns `a` and the shards `shards` to whoever registers.
scheduler_actor assigning_scheduler(caf::actor_system& sys, wire::assignment a, std::vector<shard_actor> shards,
                                    std::shared_ptr<worker_log> log) {
  return sys.spawn([=](scheduler_actor::pointer) -> scheduler_actor::behavior_type {
    return {
      [=](const wire::register_worker&) -> caf::result<wire::assignment, std::vector<shard_actor>> {
        return {a, shards};
      },
      [log](const wire::membership_change& m) { log->leaves.push_back(m); },
      [](start_atom) {},
      [](tick_atom) {},
      [](replan_atom) {},
      [](wait_atom) {},
      [](lr_atom, float) {},
      [](const wire::ctl_request&) -> std::string { return ""; },
      [](shard_atom, uint32_t, const shard_actor&, const std::string&) {},
      [](nodes_atom, const std::string&) {},
    };
  });
}

}  // namespace

TEST_CASE("protocol: a worker whose shard is lost mid-step waits for its replacement, then finishes its steps") {
  stepped t;
  auto data = std::make_shared<const dataset>(make_synthetic(64, 4, 2, 3));
  model_spec spec;
  spec.input = tensor_shape{4, 1, 1};
  spec.classes = 2;
  spec.hidden = {3};
  const uint64_t n = spec.num_params();
  wire::assignment a;
  a.worker_id = 0;
  a.shards = {shard_range{0, 0, n / 2}, shard_range{1, n / 2, n}};
  a.model = spec;
  a.batch_size = 8;
  a.data_count = 64;
  a.steps = 3;
  a.seed = 1;
  a.policy = "bsp";
  a.local_steps = 1;
  a.local_lr = 0.1f;
  a.commit_scale = 1.0f;
  a.shard_wait_s = 30;
  auto shard_of = [&](size_t i) {
    auto p = make_policy("bsp", {});
    REQUIRE(p);
    sgd_config opt;
    opt.lr = 0.1f;
    auto s = spawn_shard(t.sys, std::make_unique<shard_core>(a.shards[i], std::vector<float>(a.shards[i].size(), 0.1f),
                                                             opt, std::move(*p)));
    caf::anon_send(s, wire::membership_change{wire::membership_change::join, 0, ""});
    return s;
  };
  std::vector<shard_actor> shards{shard_of(0), shard_of(1)};
  auto log = std::make_shared<worker_log>();
  actors::worker_config wc;
  wc.scheduler = assigning_scheduler(t.sys, a, shards, log);
  wc.profiler = recording_profiler(t.sys, log);
  wc.report_window = std::chrono::milliseconds{0}; // each step's report at once (no timers here)
  wc.data = data;
  auto worker = spawn_worker(t.sys, wc);
  caf::anon_send(worker, start_atom::value);
  // Message by message until the first step is reported.
  for (int i = 0; i < 10000 && log->reports.empty(); ++i)
    REQUIRE(t.step());
  REQUIRE(log->reports.size() == 1);
  // Shard 1 goes down mid-job (the next step's reads may be here already: they come
  // with a step's acknowledgements): the worker waits, its steps not all done.
  caf::anon_send_exit(shards[1], caf::exit_reason::kill);
  t.run();
  CHECK(log->reports.size() < 3);
  CHECK(log->leaves.empty());
  // Its replacement (the same range, from its "checkpoint") is announced: the abandoned
  // step starts over and the worker finishes its three steps.
  auto replacement = shard_of(1);
  caf::anon_send(worker, shard_atom::value, uint32_t{1}, replacement, std::string{});
  t.run();
  REQUIRE(log->reports.size() == 3);
  CHECK(log->reports[2].step == 2);
  REQUIRE(log->leaves.size() == 1);
  CHECK(log->leaves[0].kind == wire::membership_change::leave);
  CHECK(log->leaves[0].reason == "finished 3 steps");
  for (auto& s : std::vector<shard_actor>{shards[0], replacement})
    caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(wc.scheduler, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(wc.profiler, caf::exit_reason::user_shutdown);
}

namespace {

// A node actor that answers the scheduler's pings and counts the workers it is asked for.
node_actor counting_node(caf::actor_system& sys, std::shared_ptr<int> asked) {
  return sys.spawn([asked](node_actor::pointer) -> node_actor::behavior_type {
    return {
      [](const wire::spawn_shard&) -> caf::result<shard_actor, std::string> {
        return make_error(errc::invalid_state, "no shards here");
      },
      [asked](const wire::spawn_worker&, const scheduler_actor&, const profiler_actor&) -> caf::result<worker_actor> {
        ++*asked;
        return make_error(errc::invalid_state, "no workers here");
      },
      [](const wire::ctl_request&) {},
      [](stop_atom) -> uint32_t { return 0; },
      [](ping_atom) -> caf::ok_atom { return caf::ok_atom::value; },
    };
  });
}

}  // namespace

// A welcome can miss its node (seen under a storm of joins and losses), and a node killed
// before it arrived was never reported lost: the cluster offers a node to a job only once
// it confirmed its welcome, and loses one that has not within 15 s.
TEST_CASE("protocol: a node is offered to jobs once it confirms its welcome, and lost if it never does") {
  stepped t;
  auto cluster = spawn_cluster(t.sys, cluster_config{"127.0.0.1:7400", {}});
  auto asked = std::make_shared<int>(0);
  auto quiet = counting_node(t.sys, asked), prompt = counting_node(t.sys, asked);
  caf::scoped_actor a{t.sys}, b{t.sys};
  wire::hello h;
  h.roles = {wire::role::worker};
  h.slots = 4;
  h.node = "never-confirms";
  a->send(cluster, h, quiet);
  h.node = "confirms";
  b->send(cluster, h, prompt);
  t.run();
  auto wa = take<wire::welcome>(a), wb = take<wire::welcome>(b);
  REQUIRE(wa);
  REQUIRE(wb);
  auto placeable = [&] {
    std::vector<std::string> names;
    a->send(cluster, nodes_atom::value);
    t.run();
    a->receive([&](const wire::cluster_status& s, const std::vector<node_actor>&) {
      for (const auto& n : s.nodes)
        names.push_back(n.name);
    }, caf::after(std::chrono::seconds(0)) >> [] {});
    return names;
  };
  CHECK(placeable().empty()); // welcomed, not confirmed: no job is placed on either
  b->send(cluster, welcomed_atom::value, wb->node_id);
  t.run();
  CHECK(placeable() == std::vector<std::string>{"confirms"});
  // The confirmation deadline (15 s; the pings every 2 s come due first).
  for (int i = 0; i < 40; ++i) {
    t.sched.trigger_timeout();
    t.run();
  }
  a->send(cluster, status_atom::value);
  t.run();
  auto st = take<wire::cluster_status>(a);
  REQUIRE(st);
  REQUIRE(st->nodes.size() == 2);
  for (const auto& n : st->nodes)
    CHECK(n.alive == (n.name == "confirms"));
  CHECK(*asked == 0); // no job: nobody was asked for workers
  caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(quiet, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(prompt, caf::exit_reason::user_shutdown);
}
