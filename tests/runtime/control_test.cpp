// The control plane's pure machines: a job's lifecycle, the cluster's membership, and the
// lockstep hand-over of lost workers' shares.
#include <catch2/catch.hpp>

#include <cmath>

#include "runtime/control/cluster_membership.hpp"
#include "runtime/control/job_lifecycle.hpp"
#include "runtime/control/job_roster.hpp"
#include "runtime/control/job_timeline.hpp"
#include "runtime/control/stall_watch.hpp"
#include "runtime/policy/bsp.hpp"
#include "runtime/policy/ssp.hpp"
#include "runtime/control/member_plan.hpp"
#include "runtime/control/node_lifecycle.hpp"
#include "runtime/control/node_watch.hpp"
#include "runtime/policy/assignment.hpp"

using namespace ashlar;
using namespace ashlar::control;

namespace {

bool has(const std::vector<job_action>& acts, job_action::kind_t k) {
  for (const auto& a : acts)
    if (a.kind == k)
      return true;
  return false;
}

constexpr uint64_t second = 1000000000ull;

}  // namespace

TEST_CASE("a job starts as soon as the cluster has a server node and a slot per worker") {
  manual_clock clock;
  job_lifecycle job{clock, job_needs{2, 4}, 120 * second};
  auto acts = job.on_capacity(capacity{0, 2});
  REQUIRE(has(acts, job_action::waiting));
  CHECK(job.lacks() == "needs a server node for its 2 shards, has none; needs 4 worker slots, has 2");
  CHECK(job.on_capacity(capacity{0, 2}).empty()); // nothing changed: nothing said again
  CHECK(has(job.on_capacity(capacity{1, 4}), job_action::start));
  CHECK(job.state() == job_lifecycle::phase::running);
  CHECK_FALSE(job.deadline());
}

TEST_CASE("a job whose nodes never come fails at its deadline naming what it lacked") {
  manual_clock clock;
  job_lifecycle job{clock, job_needs{1, 2}, 120 * second};
  job.on_capacity(capacity{1, 0});
  clock.advance(119 * second);
  CHECK(job.on_time().empty());
  clock.advance(1 * second);
  auto acts = job.on_time();
  REQUIRE(has(acts, job_action::ended));
  CHECK(job.outcome().kind == job_outcome::failed);
  CHECK(job.summary() == "the job's nodes did not join in time: it needs 2 worker slots, has 0 (waited 120 s)");
}

TEST_CASE("a shutdown while a job waits for its nodes ends the job at once, saying so") {
  manual_clock clock;
  job_lifecycle job{clock, job_needs{1, 2}, 120 * second};
  job.on_capacity(capacity{0, 0});
  auto acts = job.on_stop("the cluster was shut down by ashlar ctl shutdown");
  REQUIRE(has(acts, job_action::ended));
  CHECK(job.outcome().kind == job_outcome::stopped);
  CHECK(job.summary() == "stopped while waiting for the job's nodes: it needs a server node for its 1 shards, has "
                         "none; needs 2 worker slots, has 0 (the cluster was shut down by ashlar ctl shutdown)");
  CHECK(job.on_time().empty()); // ended: the deadline no longer matters
  CHECK(job.on_capacity(capacity{1, 2}).empty());
}

TEST_CASE("a running job asked to stop stops its workers and ends stopped unless it had trained its epochs") {
  manual_clock clock;
  job_lifecycle job{clock, job_needs{1, 1}, second};
  job.on_capacity(capacity{1, 1});
  auto acts = job.on_stop("stopped by ashlar ctl stop-job");
  REQUIRE(has(acts, job_action::stop_workers));
  CHECK(job.on_stop("again").empty());
  job.on_run_ended("", false);
  CHECK(job.outcome().kind == job_outcome::stopped);
  CHECK(job.outcome().cause == "stopped by ashlar ctl stop-job");

  job_lifecycle done{clock, job_needs{1, 1}, second};
  done.on_capacity(capacity{1, 1});
  done.on_stop("late");
  done.on_run_ended("", true);
  CHECK(done.outcome().kind == job_outcome::trained);
}

TEST_CASE("a job that ends after its start and before it trained fails naming why, or ends stopped if asked to "
          "stop, and then hears nothing more") {
  manual_clock clock;
  job_lifecycle job{clock, job_needs{1, 2}, second};
  REQUIRE(has(job.on_capacity(capacity{1, 2}), job_action::start));
  auto acts = job.on_run_ended("it ended before it trained", false);
  REQUIRE(has(acts, job_action::ended));
  CHECK(job.outcome().kind == job_outcome::failed);
  CHECK(job.summary() == "failed: it ended before it trained");
  CHECK(job.on_capacity(capacity{1, 4}).empty());
  CHECK(job.on_stop("late").empty());
  CHECK(job.on_run_ended("again").empty());

  job_lifecycle asked{clock, job_needs{1, 1}, second};
  asked.on_capacity(capacity{1, 1});
  REQUIRE(has(asked.on_stop("stopped by ashlar ctl stop-job"), job_action::stop_workers));
  asked.on_run_ended("", false);
  CHECK(asked.outcome().kind == job_outcome::stopped);
}

TEST_CASE("a worker whose script raised fails the job with that cause, whatever the run says after") {
  manual_clock clock;
  job_lifecycle job{clock, job_needs{1, 2}, second};
  job.on_capacity(capacity{1, 2});
  auto acts = job.on_worker_error("worker 1: the worker script raised ValueError: bad batch");
  REQUIRE(has(acts, job_action::stop_workers));
  CHECK(job.on_worker_error("worker 0: later").empty());
  job.on_run_ended("", true);
  CHECK(job.outcome().kind == job_outcome::failed);
  CHECK(job.outcome().cause == "worker 1: the worker script raised ValueError: bad batch");
}

TEST_CASE("a node is granted at most the slots the cluster allows one node, whatever it offers") {
  cluster_membership m{membership_limits{256, 8}};
  auto a = m.on_join(1, false, 100000);
  CHECK(a.admitted);
  CHECK(a.slots == 256);
  CHECK(a.note.find("offered 100000 worker slots") == 0);
  CHECK(m.free().worker_slots == 0); // it serves once it confirms its welcome
  CHECK(m.on_confirmed(1));
  CHECK_FALSE(m.on_confirmed(1)); // once
  CHECK(m.free().worker_slots == 256);
  for (uint32_t id = 2; id <= 8; ++id)
    CHECK(m.on_join(id, id == 2, 1).admitted);
  auto refused = m.on_join(9, false, 1);
  CHECK_FALSE(refused.admitted);
  CHECK(refused.note == "the cluster holds 8 nodes, its most");
}

TEST_CASE("one connection is one node: 5000 hellos over one connection hold one entry, and a real node still gets in") {
  cluster_membership m{membership_limits{256, 8}};
  for (uint32_t id = 1; id <= 7; ++id) // a full cluster but for one place
    REQUIRE(m.on_join(id, false, 4, "peer " + std::to_string(id)).admitted);
  auto first = m.on_join(100, false, 4, "hostile");
  REQUIRE(first.admitted);
  CHECK_FALSE(first.replaces);
  uint32_t replaced = 100;
  for (uint32_t id = 101; id < 5100; ++id) {
    auto a = m.on_join(id, false, 4, "hostile");
    REQUIRE(a.admitted);
    REQUIRE(a.replaces == replaced); // the adapter loses the one it replaces
    m.on_lost(*a.replaces);
    replaced = id;
  }
  CHECK(m.live_nodes() == 8);
  // A connection that hosts nothing yet, at the table's bound: refused; the replacing one
  // is admitted though the table is full (it frees its own place).
  CHECK_FALSE(m.on_join(6000, false, 4, "another").admitted);
  auto again = m.on_join(6001, false, 4, "peer 3");
  CHECK(again.admitted);
  CHECK(again.replaces == 3u);
  m.on_lost(3);
  // Nodes of this process (a local job's) are many over no connection.
  m.on_lost(6001);
  m.on_lost(5099);
  CHECK(m.on_join(7000, false, 4).admitted);
  CHECK(m.on_join(7001, false, 4).admitted);
  CHECK(m.live_nodes() == 8);
}

TEST_CASE("a node joining a running job starts workers up to the job's bound, at most its free slots") {
  cluster_membership m;
  for (uint32_t id = 1; id <= 3; ++id) {
    m.on_join(id, id == 1, id == 1 ? 0 : 32);
    m.on_confirmed(id);
  }
  m.job_started(64, {{2, 32}, {3, 32}});
  CHECK(m.job_workers() == 64);
  CHECK(m.free().worker_slots == 0);
  CHECK(m.on_lost(3) == 32); // one event: the node's 32 workers
  CHECK(m.on_lost(3) == 0);  // told twice: counted once
  CHECK(m.job_workers() == 32);
  m.on_join(4, false, 100000);
  CHECK(m.to_start_on(4) == 0); // not before it confirms its welcome
  m.on_confirmed(4);
  CHECK(m.to_start_on(4) == 32);
  m.placed(4, 32);
  CHECK(m.to_start_on(4) == 0);
  m.on_join(5, false, 8);
  m.on_confirmed(5);
  CHECK(m.to_start_on(5) == 0); // the job has all its workers
  m.job_ended();
  CHECK(m.to_start_on(5) == 0);
}

TEST_CASE("a welcomed node that does not confirm is given up on, and a lost one confirms nothing") {
  cluster_membership m;
  m.on_join(1, false, 4);
  CHECK_FALSE(m.serving(1));
  CHECK(m.confirm_due(1)); // the adapter's timer: not confirmed, so lost
  CHECK(m.on_lost(1) == 0);
  CHECK_FALSE(m.on_confirmed(1)); // a confirmation after the loss counts for nothing
  CHECK_FALSE(m.confirm_due(1));
  m.on_join(2, false, 4);
  CHECK(m.on_confirmed(2));
  CHECK(m.serving(2));
  CHECK_FALSE(m.confirm_due(2));
  CHECK(m.limits().confirm_within_ns == 15'000'000'000ull);
}

namespace {

// What a lockstep member trains from step `done` on under its directive (if any): its old
// part up to the directive's from_step, its new part after.
double trains_from(const member_part& old, const std::map<uint32_t, batch_directive>& dirs, uint32_t id,
                   uint64_t done) {
  auto d = dirs.find(id);
  if (d == dirs.end())
    return static_cast<double>(old.steps - done) * step_samples(old);
  auto now = old;
  if (d->second.data_count > 0)
    now.data_begin = d->second.data_begin, now.data_count = d->second.data_count;
  const uint64_t steps = d->second.steps > 0 ? d->second.steps : old.steps;
  const uint64_t from = std::max(done, std::min(d->second.from_step, steps));
  return static_cast<double>(from - done) * step_samples(old) + static_cast<double>(steps - from) * step_samples(now);
}

} // namespace

TEST_CASE("the samples a member still trains count its steps on earlier parts, and a late directive is corrected") {
  // 10 steps on a part of 64 (batch 32: steps of 32); a directive moves it to a part of 40
  // (two steps of 20) from step 6, for 12 steps in all.
  member_part m{32, 0, 64, 10};
  CHECK(samples_left(m, 4) == Approx(6 * 32.0));
  auto after = after_directive(m, batch_directive{32, 6, 64, 40, 12});
  CHECK(after.steps == 12);
  CHECK(after.data_count == 40);
  CHECK(samples_between(after, 4, 6) == Approx(2 * 32.0)); // the old part's
  CHECK(samples_left(after, 4) == Approx(2 * 32.0 + 6 * 20.0));
  // Another directive from step 8 keeps steps 6 and 7 on the part of 40, and one from step
  // 5 (before the first took effect) replaces it from there.
  auto again = after_directive(after, batch_directive{32, 8, 0, 96, 14});
  CHECK(samples_between(again, 4, 10) == Approx(2 * 32.0 + 2 * 20.0 + 2 * 32.0));
  auto sooner = after_directive(after, batch_directive{32, 5, 0, 96, 14});
  CHECK(samples_between(sooner, 4, 10) == Approx(1 * 32.0 + 5 * 32.0));
  // A directive in time is taken as it is; one that came 2 steps late trained 2 old steps
  // (32 each) where the plan counted the new part's (20 each): 2 x 12 samples fewer to go,
  // a step less to the nearest step.
  CHECK(steps_after_directive(12, 6, 6, 32.0, 20.0) == 12);
  CHECK(steps_after_directive(12, 6, 8, 32.0, 20.0) == 8 + 3);
  // Rounded up, never short: 120 planned less 3 x 32 leaves 24, 1.2 steps of 20: 2 more.
  CHECK(steps_after_directive(12, 6, 9, 32.0, 20.0) == 9 + 2);
  CHECK(steps_after_directive(12, 6, 20, 32.0, 20.0) == 20); // past all of it: nothing more
  CHECK(steps_after_directive(0, 6, 8, 32.0, 20.0) == 0);    // no steps: as it was
}

TEST_CASE("lockstep losses hand over exactly the samples the lost workers owed, however many come") {
  // 8 workers of batch 32, 100 steps each; worker 7 is lost after 40 steps. A step trains
  // step_samples of its part: parts of 1000 are 32 batches a pass, the last of 8 samples.
  std::map<uint32_t, member_part> live;
  std::map<uint32_t, uint64_t> done;
  for (uint32_t id = 0; id < 7; ++id) {
    live[id] = member_part{32, id * 1000, 1000, 100};
    done[id] = 40;
  }
  CHECK(step_samples(live[0]) == Approx(1000.0 / 32));
  const double owed_lost = 60 * step_samples(member_part{32, 7000, 1000, 100});
  auto h = hand_over_lockstep(live, done, static_cast<uint64_t>(owed_lost), 8000, false);
  double assigned = 0;
  for (const auto& [id, m] : live) {
    assigned += trains_from(m, h.parts, id, done[id]);
    REQUIRE(h.parts.count(id) > 0);
    CHECK(h.parts[id].from_step == 40 + directive_lead); // its old part while the directive comes
  }
  const double owed = 7 * 60 * step_samples(live[0]) + static_cast<uint64_t>(owed_lost);
  CHECK(assigned >= owed - 1e-6);
  CHECK(assigned < owed + 32); // at most one batch past what is owed
  CHECK(h.reassigned_samples == static_cast<uint64_t>(owed_lost));

  // Many single losses one after another add up to the same as one: nothing is rounded
  // up per loss (each used to add a round to every live worker). Parts of 30 samples (one
  // step a pass) grow past the batch of 32 (two steps a pass) as members are lost, so a
  // step on the old part and one on the new part train different samples.
  std::map<uint32_t, member_part> many;
  std::map<uint32_t, uint64_t> at;
  const uint64_t set = 64 * 30;
  for (uint32_t id = 0; id < 64; ++id) {
    many[id] = member_part{32, id * 30, 30, 100};
    at[id] = 50;
  }
  double trained = 0; // what the members' steps on their old parts trained, loss by loss
  auto left_in = [&](const std::map<uint32_t, member_part>& ms) {
    double total = 0;
    for (const auto& [id, m] : ms)
      total += static_cast<double>(m.steps - at[id]) * step_samples(m);
    return total;
  };
  const double owed_all = left_in(many);
  for (uint32_t lost = 63; lost >= 32; --lost) {
    const auto gone = many[lost];
    many.erase(lost);
    const auto owed_gone = static_cast<uint64_t>(std::ceil((gone.steps - at[lost]) * step_samples(gone)));
    const double before = left_in(many) + static_cast<double>(owed_gone);
    auto step = hand_over_lockstep(many, at, owed_gone, set, false);
    double after = 0;
    for (const auto& [id, m] : many)
      after += trains_from(m, step.parts, id, at[id]);
    CHECK(after >= before - 1e-6); // what was owed, trained once
    CHECK(after < before + 32);    // and at most one batch past it
    // Each member takes its directive's lead on its old part, then is at its new part.
    for (auto& [id, m] : many) {
      auto d = step.parts.find(id);
      if (d == step.parts.end())
        continue;
      const uint64_t from = std::min(d->second.from_step, d->second.steps);
      trained += static_cast<double>(from - at[id]) * step_samples(m);
      at[id] = from;
      if (d->second.data_count > 0)
        m.data_begin = d->second.data_begin, m.data_count = d->second.data_count;
      m.steps = d->second.steps;
    }
    at.erase(lost);
  }
  const double total = trained + left_in(many);
  CHECK(total >= owed_all - 1e-6);
  CHECK(total < owed_all + 32 * 32); // below a batch per loss: the excess is carried, not re-added
}

TEST_CASE("a ring's members keep equal steps after a hand-over") {
  std::map<uint32_t, member_part> live{{0, {32, 0, 50, 10}}, {1, {32, 50, 50, 10}}, {2, {32, 100, 50, 10}}};
  std::map<uint32_t, uint64_t> done{{0, 4}, {1, 4}, {2, 4}};
  auto h = hand_over_lockstep(live, done, 33, 150, true);
  REQUIRE(h.parts.size() == 3);
  CHECK(h.parts[0].steps == h.parts[1].steps);
  CHECK(h.parts[1].steps == h.parts[2].steps);
  CHECK(h.parts[0].steps == 4 + 6 + 1); // 6 left each, 33 owed: one more round
}

namespace {

bool does(const std::vector<node_action>& acts, node_action::kind_t k) {
  for (const auto& a : acts)
    if (a.kind == k)
      return true;
  return false;
}

}  // namespace

TEST_CASE("a node that loses its scheduler waits a grace for a shutdown, then stops what it hosts and probes") {
  manual_clock clock;
  node_lifecycle node{clock, "127.0.0.1:7400", node_timing{}};
  CHECK(node.on_scheduler_down("remote_link_unreachable").empty());
  CHECK(node.state() == node_lifecycle::phase::lost);
  clock.advance(500 * 1000000ull);
  CHECK(node.on_time().empty());
  // The shutdown it was told of overtook the connection's end: it exits 0.
  node_lifecycle told{clock, "127.0.0.1:7400", node_timing{}};
  told.on_scheduler_down("x");
  auto bye = told.on_shutdown();
  REQUIRE(does(bye, node_action::exit));
  CHECK(bye.front().code == 0);
  clock.advance(600 * 1000000ull);
  auto acts = node.on_time();
  CHECK(does(acts, node_action::stop_hosted));
  CHECK(does(acts, node_action::probe));
  CHECK(node.state() == node_lifecycle::phase::probing);
}

TEST_CASE("a node rejoins a scheduler that answers again, after its settle time, and gives up naming the last try") {
  manual_clock clock;
  node_timing t;
  t.rejoin_ns = 10 * second;
  node_lifecycle node{clock, "127.0.0.1:7400", t};
  node.on_scheduler_down("heartbeat timeout");
  clock.advance(second);
  node.on_time();
  CHECK(node.on_probe(node_lifecycle::answer::failed, "connection refused").empty());
  clock.advance(t.probe_gap_ns);
  CHECK(does(node.on_time(), node_action::probe));
  node.on_probe(node_lifecycle::answer::admitted, "");
  CHECK(node.state() == node_lifecycle::phase::settling);
  clock.advance(t.settle_ns - 1);
  CHECK(node.on_time().empty());
  clock.advance(1);
  auto acts = node.on_time();
  REQUIRE(does(acts, node_action::rejoin));
  CHECK(node.on_rejoin(node_lifecycle::answer::failed, "timeout").front().kind == node_action::rejoin);
  auto back = node.on_rejoin(node_lifecycle::answer::admitted, "node 7");
  CHECK(back.front().text == "joined the scheduler at 127.0.0.1:7400 again as node 7");
  CHECK(node.state() == node_lifecycle::phase::serving);
  CHECK(node.rejoins() == 1);

  // Lost again, and it never answers: after the rejoin wait it exits 1, naming the last try.
  node.on_scheduler_down("remote_link_unreachable");
  clock.advance(second);
  REQUIRE(does(node.on_time(), node_action::probe));
  CHECK(node.on_probe(node_lifecycle::answer::failed, "connection refused").empty());
  for (int i = 0; i < 40 && node.state() != node_lifecycle::phase::ended; ++i) {
    clock.advance(t.probe_gap_ns);
    auto a = node.on_time();
    if (does(a, node_action::probe)) {
      auto end = node.on_probe(node_lifecycle::answer::failed, "connection refused");
      if (does(end, node_action::exit)) {
        CHECK(end.front().code == 1);
        CHECK(end.front().text == "lost the scheduler at 127.0.0.1:7400 (remote_link_unreachable): it did not come "
                                  "back within 10 s; exiting (the last try: connection refused)");
      }
    }
  }
  CHECK(node.state() == node_lifecycle::phase::ended);
}

TEST_CASE("a node refused for good by its scheduler, or one that may not rejoin, exits 1 at once") {
  manual_clock clock;
  node_lifecycle node{clock, "h:1", node_timing{}};
  node.on_scheduler_down("x");
  clock.advance(2 * second);
  node.on_time();
  auto end = node.on_probe(node_lifecycle::answer::refused, "handshake_refused: another cluster token");
  REQUIRE(does(end, node_action::exit));
  CHECK(end.front().text == "lost the scheduler at h:1 (x): handshake_refused: another cluster token");
  node_timing none;
  none.rejoin_ns = 0;
  node_lifecycle quick{clock, "h:1", none};
  quick.on_scheduler_down("x");
  clock.advance(2 * second);
  auto out = quick.on_time();
  REQUIRE(does(out, node_action::exit));
  CHECK(out.front().code == 1);
}

TEST_CASE("a stop signal drains the node's workers, a second leaves at once, and a drain past its time ends it") {
  manual_clock clock;
  node_lifecycle node{clock, "h:1", node_timing{}};
  auto acts = node.on_signal("SIGTERM");
  CHECK(does(acts, node_action::drain));
  CHECK(node.state() == node_lifecycle::phase::draining);
  auto done = node.on_drained();
  REQUIRE(does(done, node_action::exit));
  CHECK(done.front().code == 0);
  node_lifecycle twice{clock, "h:1", node_timing{}};
  twice.on_signal("SIGINT");
  CHECK(does(twice.on_signal("SIGINT"), node_action::exit));
  node_lifecycle slow{clock, "h:1", node_timing{}};
  slow.on_signal("SIGTERM");
  clock.advance(30 * second);
  CHECK(does(slow.on_time(), node_action::exit));
  // While waiting for a lost scheduler, a signal ends the wait and the node.
  node_lifecycle waiting{clock, "h:1", node_timing{}};
  waiting.on_scheduler_down("x");
  clock.advance(2 * second);
  waiting.on_time();
  CHECK(does(waiting.on_signal("SIGINT"), node_action::exit));
}

TEST_CASE("a stop signal on a node serving a running job's shards holds them until the scheduler ends the job") {
  manual_clock clock;
  node_lifecycle node{clock, "h:1", node_timing{}};
  auto acts = node.on_signal("SIGTERM", true);
  CHECK_FALSE(does(acts, node_action::drain)); // the shards stay
  CHECK(node.state() == node_lifecycle::phase::draining);
  clock.advance(10 * second);
  CHECK(node.on_time().empty());
  CHECK(does(node.on_shutdown(), node_action::exit)); // the scheduler ended the job
  // The scheduler gone: the job is over, the node exits at once.
  node_lifecycle lost{clock, "h:1", node_timing{}};
  lost.on_signal("SIGTERM", true);
  CHECK(does(lost.on_scheduler_down("connection closed"), node_action::exit));
  // The job does not end within the drain time: it exits, saying so; a second signal at once.
  node_lifecycle late{clock, "h:1", node_timing{}};
  late.on_signal("SIGTERM", true);
  clock.advance(30 * second);
  auto out = late.on_time();
  REQUIRE(does(out, node_action::exit));
  CHECK(out.front().text.find("the job did not end within 30 s") != std::string::npos);
  node_lifecycle twice{clock, "h:1", node_timing{}};
  twice.on_signal("SIGTERM", true);
  CHECK(does(twice.on_signal("SIGTERM"), node_action::exit));
}

TEST_CASE("a plan of membership changes moves nothing for members that finished, and hands a lost one's steps over once") {
  std::map<uint32_t, ledger_entry> members;
  for (uint32_t id = 0; id < 4; ++id)
    members[id] = ledger_entry{member_part{32, id * 100, 100, 50}, false, false, true, 0};
  members[3].left = true; // finished all its steps
  std::map<uint32_t, uint64_t> done{{0, 50}, {1, 49}, {2, 49}, {3, 50}};
  auto none = plan_member_changes(members, {3}, {}, done, 400, true, false);
  CHECK(none.live == 0);
  CHECK(none.directives.empty());
  members[2].left = true; // lost with 20 of its 50 steps trained
  members[2].failed = true;
  done[2] = 30;
  auto p = plan_member_changes(members, {2}, {}, done, 400, true, false);
  CHECK(p.live == 2);
  const double per_step = step_samples(members[2].part); // parts of 100: 25 samples a step
  CHECK(per_step == Approx(25.0));
  CHECK(p.handed_samples == 20 * 25);
  CHECK(p.lost_steps.at(2) == 30);
  double added = 0;
  for (const auto& [id, d] : p.directives)
    if (d.steps > 0) {
      auto now = members[id].part;
      if (d.data_count > 0)
        now.data_count = d.data_count;
      // What the member's steps left train on its new part, against what they trained on its old one.
      added += static_cast<double>(d.steps - done[id]) * step_samples(now)
               - static_cast<double>(members[id].part.steps - done[id]) * per_step;
    }
  CHECK(added >= 20 * 25 - 1e-6); // what was owed, one batch at most past it
  CHECK(added <= 20 * 25 + 32);
  // A newcomer takes a part of the set and steps from the same rule.
  members[5] = ledger_entry{member_part{32, 0, 400, 0}, false, false, false, 0};
  auto j = plan_member_changes(members, {}, {5}, done, 400, true, false);
  CHECK(j.newcomer_steps.count(5) == 1);
  // A joiner lost before the plan that admits it (its node killed as it registered) was
  // owed nothing: the steps of its registration are no share of the job's.
  members[6] = ledger_entry{member_part{32, 0, 100, 50}, true, true, false, 0};
  for (const std::set<uint32_t>& joining : {std::set<uint32_t>{}, std::set<uint32_t>{6}}) {
    auto k = plan_member_changes(members, {6}, joining, done, 400, true, false);
    CHECK(k.handed_samples == 0);
    CHECK(k.lost_steps.count(6) == 0);
    CHECK(k.newcomer_steps[6] == 0);
  }
}

TEST_CASE("a ring's plan after a loss gives its live members equal steps from the furthest count, and what they train covers what is owed") {
  // Three ring members of 100 samples each, batch 32 (25 samples a step), 50 steps. Member
  // 2 is lost with 30 steps trained; member 0 counts 31 and member 1 30 (its report of the
  // step a loss cut short, or one still on its way: it is at step 31 all the same).
  std::map<uint32_t, ledger_entry> members;
  for (uint32_t id = 0; id < 3; ++id)
    members[id] = ledger_entry{member_part{32, id * 100, 100, 50}, false, false, true, 0};
  members[2].left = members[2].failed = true;
  std::map<uint32_t, uint64_t> done{{0, 31}, {1, 30}, {2, 30}};
  auto p = plan_member_changes(members, {2}, {}, done, 300, true, true);
  REQUIRE(p.live == 2);
  CHECK(p.handed_samples == 20 * 25);
  REQUIRE(p.directives.count(0) == 1);
  REQUIRE(p.directives.count(1) == 1);
  CHECK(p.directives.at(0).steps == p.directives.at(1).steps);
  // From step 31, on parts of 150 (5 steps of 30 a pass), both train what is owed: the
  // lost member's 20 steps and their own 19 each.
  const double owed = (20 + 19 + 19) * 25.0;
  const double trained = 2.0 * static_cast<double>(p.directives.at(0).steps - 31) * 30.0;
  CHECK(trained >= owed - 1e-6);
  CHECK(trained <= owed + 2 * 30); // one round at most past it
  // A member admitted later counts its steps from 0 (20 of its 39): on the same scale of
  // steps left it is at the others' step, and keeps its count.
  members[3] = ledger_entry{member_part{32, 0, 100, 39}, false, false, true, 0};
  done[3] = 20;
  auto q = plan_member_changes(members, {2}, {}, done, 300, true, true);
  REQUIRE(q.directives.count(3) == 1);
  REQUIRE(q.directives.count(0) == 1);
  CHECK(q.directives.at(3).from_step == 20);
  CHECK(q.directives.at(3).steps - 20 == q.directives.at(0).steps - 31);
  CHECK(q.directives.at(1).steps - 31 == q.directives.at(0).steps - 31);
}

TEST_CASE("node_watch pings each live node once per interval and loses one that answers nothing for the timeout") {
  manual_clock clock;
  control::watch_timing t;
  t.interval_ns = 2000000000ull;
  t.timeout_ns = 20000000000ull;
  control::node_watch w{clock, t};
  w.watch(1);
  w.watch(2);
  CHECK(w.to_ping().empty()); // both counted as answered (and pinged) when they joined
  clock.advance(std::chrono::seconds{2});
  CHECK(w.to_ping() == std::vector<uint32_t>{1, 2});
  CHECK(w.to_ping().empty()); // not again within the interval
  for (int s = 0; s < 8; ++s) { // 4 s to 18 s
    clock.advance(std::chrono::seconds{2});
    w.answered(1); // node 1 answers, node 2 is silent
    CHECK(w.silent().empty());
    w.to_ping();
  }
  clock.advance(std::chrono::seconds{2}); // node 2: 20 s without an answer
  CHECK(w.silent() == std::vector<uint32_t>{2});
  CHECK(w.watched() == 1);
  CHECK(w.silent().empty()); // lost once
  w.forget(1);
  clock.advance(std::chrono::seconds{60});
  CHECK(w.silent().empty());
  CHECK(w.to_ping().empty());
}

// The job driver's duties as timed events (runtime/control/job_timeline.hpp): a steady job
// of 1,000 samples a second, a set of 600, 3 epochs.
namespace {
struct steady_job {
  manual_clock clock;
  uint64_t samples = 0;
  // Advances the clock by the timeline's wait, training at `rate` samples a second.
  double step(job_timeline& t, double rate = 1000) {
    const double w = t.wait();
    clock.advance(static_cast<uint64_t>(std::ceil(w * 1e9)));
    samples += static_cast<uint64_t>(w * rate);
    return w;
  }
};
}  // namespace

TEST_CASE("the job timeline sees each epoch boundary within a few samples of it, waking rarely in between") {
  steady_job j;
  timeline_settings s;
  s.eval_every_epoch = true;
  s.epochs = 3;
  s.epoch_samples = 600;
  s.budget = 1800;
  s.progress_interval = 10; // none within the run
  s.note_every = 10;
  job_timeline t{j.clock, s};
  t.training_started();
  std::vector<uint64_t> seen_at;
  int looks = 0;
  while (j.samples < 1800 && looks < 10000) {
    auto d = t.look(j.samples);
    ++looks;
    if (d.evaluate) {
      seen_at.push_back(j.samples);
      t.evaluation_started(d.interval_eval, j.samples);
    }
    j.step(t);
  }
  // Boundaries at 600 and 1200 (the last epoch's is the final evaluation, not the timeline's).
  REQUIRE(seen_at.size() == 2);
  CHECK(seen_at[0] >= 600);
  CHECK(seen_at[0] <= 610);
  CHECK(seen_at[1] >= 1200);
  CHECK(seen_at[1] <= 1210);
  // 1.8 s of training at max_wait 0.1 s is about 18 looks, plus a few near each boundary
  // (a 10 ms tick would be 180).
  CHECK(looks < 50);
}

TEST_CASE("the job timeline stops workers at their own pace at the budget, and at the time limit") {
  steady_job j;
  timeline_settings s;
  s.epochs = 2;
  s.epoch_samples = 1000;
  s.budget = 2000;
  s.stop_at_budget = true;
  job_timeline t{j.clock, s};
  t.training_started();
  uint64_t stopped_at = 0;
  for (int i = 0; i < 10000 && stopped_at == 0; ++i) {
    if (t.look(j.samples).stop_budget)
      stopped_at = j.samples;
    else
      j.step(t, 5000);
  }
  CHECK(stopped_at >= 2000);
  CHECK(stopped_at <= 2000 + 5000 * 0.005 + 1); // within a min_wait of samples past it

  steady_job k;
  timeline_settings tl;
  tl.time_limit = 3.0;
  tl.epoch_samples = 1000;
  job_timeline u{k.clock, tl};
  u.training_started();
  double at = -1;
  for (int i = 0; i < 1000 && at < 0; ++i) {
    if (u.look(k.samples).stop_time)
      at = u.seconds();
    else
      k.step(u);
  }
  CHECK(at >= 3.0);
  CHECK(at <= 3.0 + 1e-6); // the wait ends at the limit itself
}

TEST_CASE("the job timeline's progress lines, notes and interval evaluations come on their own schedule") {
  steady_job j;
  timeline_settings s;
  s.progress_interval = 1.0;
  s.eval_interval = 0.5;
  s.epoch_samples = 1000000;
  s.note_every = 1.0;
  job_timeline t{j.clock, s};
  // Before training: no progress line, no evaluation (the parameters are the initial ones).
  auto before = t.look(0);
  CHECK_FALSE(before.progress);
  CHECK_FALSE(before.evaluate);
  j.clock.advance(std::chrono::seconds(3));
  t.training_started();
  CHECK(t.seconds() == 0.0);
  int progress = 0, evals = 0, notes = 0;
  while (t.seconds() < 10.0 - 1e-9) {
    j.step(t);
    auto d = t.look(j.samples);
    progress += d.progress;
    notes += d.note;
    if (d.evaluate) {
      ++evals;
      t.evaluation_started(d.interval_eval, j.samples);
    }
  }
  CHECK(progress == 10);
  CHECK(notes == 10);
  CHECK(evals == 20);
  // An evaluation seen late (the driver busy) keeps the grid: the next is due at the grid's
  // next point, not an interval after the late one.
  job_timeline late{j.clock, s};
  late.training_started();
  j.clock.advance(std::chrono::milliseconds(700)); // due at 0.5, seen at 0.7
  auto d = late.look(j.samples);
  REQUIRE(d.evaluate);
  late.evaluation_started(d.interval_eval, j.samples);
  j.clock.advance(std::chrono::milliseconds(290)); // 0.99: not yet
  CHECK_FALSE(late.look(j.samples).evaluate);
  j.clock.advance(std::chrono::milliseconds(20)); // 1.01: the grid's 1.0 has come
  CHECK(late.look(j.samples).evaluate);
}

// Settings of 100-sample epochs whose lost shards wait `shard_wait` s.
timeline_settings waiting_shards(double shard_wait) {
  timeline_settings s;
  s.shard_wait = shard_wait;
  s.epoch_samples = 100;
  return s;
}

TEST_CASE("the job timeline names a lost shard whose wait is over, and none served again in time") {
  manual_clock clock;
  const auto s = waiting_shards(5);
  job_timeline t{clock, s};
  t.training_started();
  t.shard_lost(1);
  t.shard_lost(0);
  CHECK(t.look(0).shards_expired.empty());
  CHECK_FALSE(t.look(0).evaluate); // none while a shard is away
  clock.advance(std::chrono::seconds(3));
  t.shard_back(0);
  t.shard_lost(1); // lost again before served: its deadline stays the first loss's
  CHECK(t.wait() <= 2.0 + s.min_wait + 1e-9);
  clock.advance(std::chrono::milliseconds(2100));
  auto d = t.look(0);
  REQUIRE(d.shards_expired.size() == 1);
  CHECK(d.shards_expired[0] == 1);
}

TEST_CASE("a job asked to stop is overdue after the stop's grace, whatever it waits for, and a second request "
          "keeps the first's time") {
  manual_clock clock;
  const auto s = waiting_shards(60);
  job_timeline t{clock, s};
  t.training_started();
  t.shard_lost(0); // the only node died: its shard waits out 60 s, a stop does not
  CHECK_FALSE(t.stop_was_asked());
  CHECK_FALSE(t.look(0).stop_overdue);
  t.stop_asked();
  CHECK(t.stop_was_asked());
  clock.advance(std::chrono::seconds(2));
  t.stop_asked();
  CHECK_FALSE(t.look(0).stop_overdue);
  CHECK(t.wait() <= s.stop_grace - 2 + s.min_wait + 1e-9);
  clock.advance(std::chrono::milliseconds(1000));
  CHECK(t.look(0).stop_overdue);
  CHECK(t.stop_overdue());
  CHECK(s.stop_grace <= 5); // a stop ends any job within 5 s
  CHECK(t.look(0).shards_expired.empty());
}

// The scheduler's roster (runtime/control/job_roster.hpp): the start barrier and the end.
TEST_CASE("the roster starts training when the job's workers are ready, or at the timeout with those that came") {
  manual_clock clock;
  using A = job_roster::action;
  job_roster all{clock, 3, 10'000'000'000ull, 0};
  CHECK(all.next_timer() == 0); // nobody waits yet
  CHECK(all.ready() == A::none);
  const uint64_t deadline = all.next_timer();
  CHECK(deadline == clock.steady_ns() + 10'000'000'000ull);
  CHECK(all.ready() == A::none);
  CHECK(all.ready() == A::start);
  CHECK(all.started());
  CHECK(all.began());
  CHECK(all.ready() == A::none); // no second start
  clock.advance(std::chrono::seconds(11));
  CHECK(all.timer() == A::none); // a stale timer does nothing

  job_roster some{clock, 4, 10'000'000'000ull, 0};
  some.ready();
  clock.advance(std::chrono::seconds(4));
  some.ready();
  CHECK(some.timer() == A::none); // early
  clock.advance(std::chrono::seconds(6));
  CHECK(some.timer() == A::start); // 10 s after the first, with 2 of 4
  CHECK(some.at_barrier() == 2);
  CHECK(some.next_timer() == 0);
}

TEST_CASE("the roster ends a job whose members are all gone, or waits for a joiner while lost ones left steps") {
  manual_clock clock;
  using A = job_roster::action;
  job_roster r{clock, 1, 1'000'000'000ull, 30'000'000'000ull};
  REQUIRE(r.ready() == A::start);
  // Finished on their own, or stopping, or failed: the job ends.
  {
    job_roster done{clock, 1, 1'000'000'000ull, 30'000'000'000ull};
    done.ready();
    CHECK_FALSE(done.may_wait(0, false, false));
    CHECK(done.all_left(0, 0, false, false) == A::end);
    CHECK_FALSE(done.started());
    CHECK(done.began()); // it trained, and ended
    job_roster stopping{clock, 1, 1'000'000'000ull, 30'000'000'000ull};
    stopping.ready();
    CHECK(stopping.all_left(2, 40, true, false) == A::end);
    job_roster failed{clock, 1, 1'000'000'000ull, 30'000'000'000ull};
    failed.ready();
    CHECK(failed.all_left(2, 40, false, true) == A::end);
    job_roster no_wait{clock, 1, 1'000'000'000ull, 0};
    no_wait.ready();
    CHECK(no_wait.all_left(2, 40, false, false) == A::end);
  }
  // Lost with nothing left untaken: ends; with steps left: waits, a joiner ends the wait.
  CHECK(r.may_wait(2, false, false));
  CHECK(r.all_left(2, 40, false, false) == A::wait_for_joiner);
  CHECK(r.next_timer() == clock.steady_ns() + 30'000'000'000ull);
  clock.advance(std::chrono::seconds(10));
  r.joined();
  CHECK(r.state() == job_roster::phase::running);
  CHECK(r.timer() == A::none);
  // Lost again, and nobody comes within the wait: the job ends.
  CHECK(r.all_left(3, 12, false, false) == A::wait_for_joiner);
  clock.advance(std::chrono::seconds(29));
  CHECK(r.timer() == A::none);
  clock.advance(std::chrono::seconds(1));
  CHECK(r.timer() == A::end);
  CHECK(r.state() == job_roster::phase::ended);
  CHECK(r.all_left(3, 12, false, false) == A::none); // once

  // Stopped before its barrier filled: no start, and it ends once the workers that came left.
  job_roster early{clock, 4, 1'000'000'000ull, 0};
  early.ready();
  early.stop_before_start();
  clock.advance(std::chrono::seconds(2));
  CHECK(early.timer() == A::none);
  CHECK(early.all_left(0, 0, true, false) == A::end);
  CHECK_FALSE(early.began()); // ended before its start: it never trained
}

TEST_CASE("the roster fails a running job left with fewer workers than train.min_workers, only once it runs") {
  manual_clock clock;
  job_roster r{clock, 4, 10'000'000'000ull, 30'000'000'000ull, 3};
  CHECK(r.min_workers() == 3);
  r.ready();
  CHECK_FALSE(r.too_few(1)); // before the start the barrier decides
  r.ready();
  r.ready();
  REQUIRE(r.ready() == job_roster::action::start);
  CHECK_FALSE(r.too_few(3));
  CHECK(r.too_few(2));
  CHECK(r.too_few(0));
  // The default floor of 1: a job that lost every worker waits for a joiner, it does not fail.
  job_roster one{clock, 2, 10'000'000'000ull, 30'000'000'000ull};
  one.ready();
  one.ready();
  CHECK_FALSE(one.too_few(1));
  CHECK_FALSE(one.too_few(0));
}

TEST_CASE("a held read past the deadline from the measured speeds removes the workers it waits for, never the "
          "waiting ones") {
  CHECK(stall_deadline(0.05) == 60);  // fast steps: the floor
  CHECK(stall_deadline(4.0) == 80);   // 20x a 4 s step
  CHECK(stall_deadline(30.0) == 100); // the ceiling, under a worker's 120 s request timeout
  CHECK(stall_deadline(std::nan("")) == 60);
  // BSP, 3 workers: 0 and 2 pushed, 1 hangs in its step; the policy names 1.
  bsp_policy bsp;
  for (uint32_t w = 0; w < 3; ++w)
    bsp.on_join(w);
  CHECK(bsp.holding_up().empty()); // no round begun: nobody waits
  bsp.on_push(0, 0, 0);
  bsp.on_push(2, 0, 0);
  CHECK(bsp.holding_up() == std::vector<worker_id>{1});
  stall_view v{59.0, bsp.holding_up(), {0.05, 0.04, 0.06}};
  CHECK(judge_stall(v).remove.empty());
  v.held_seconds = 61;
  auto verdict = judge_stall(v);
  CHECK(verdict.remove == std::vector<uint32_t>{1});
  CHECK(verdict.why.find("the others waited 61 s for its step, past the deadline of 60 s") == 0);
  // A slow job's deadline is longer: 20x its slowest step.
  v.step_seconds = {3.9, 4.0};
  CHECK(judge_stall(v).remove.empty());
  v.held_seconds = 81;
  CHECK(judge_stall(v).remove == std::vector<uint32_t>{1});
  // SSP with bound 2: the slowest keeps the others back once they are more than 2 ahead.
  policy_config pc;
  pc.staleness_bound = 2;
  ssp_policy ssp{pc};
  for (uint32_t w = 0; w < 3; ++w)
    ssp.on_join(w);
  for (int k = 0; k < 3; ++k) {
    ssp.on_push(0, 0, 0);
    ssp.on_push(2, 0, 0);
  }
  CHECK(ssp.holding_up() == std::vector<worker_id>{1});
  ssp.on_push(1, 0, 0);
  CHECK(ssp.holding_up().empty());
}
