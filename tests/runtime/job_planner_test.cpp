// The scheduler's decisions without a cluster: each policy's job planner and the batch
// allocation planner fed views tick by tick, and the assignment rules.
#include <catch2/catch.hpp>

#include <numeric>

#include "runtime/alloc/batch_allocation.hpp"
#include "runtime/policy/batch_planner.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/policy/adaptive_k.hpp"
#include "runtime/policy/ashl.hpp"
#include "runtime/policy/assignment.hpp"
#include "runtime/policy/job_planner.hpp"
#include "runtime/policy/ring.hpp"

using namespace ashlar;

namespace {

struct fixture {
  train_config job;
  planner_context ctx;
  explicit fixture(const std::string& policy, const std::string& allocation = "equal") {
    job.policy = policy;
    job.allocation = *parse_allocation(allocation);
    job.workers = 4;
    job.batch_size = 64;
    ctx.job = &job;
    ctx.train_size = 60000;
    ctx.lockstep = traits_of(policy).lockstep;
  }
};

// Four live workers at speeds 1, 1, 2, 4: compute 0.4, 0.4, 0.2, 0.1 s per step (64
// samples) times `scale`, `comm` s of communication per step, `steps` steps each.
planner_view hetero(double t_s, double loss, uint64_t steps, double scale = 1.0, double comm = 0.05) {
  planner_view v;
  v.t_s = t_s;
  v.loss = loss;
  const double compute[] = {0.4, 0.4, 0.2, 0.1};
  for (uint32_t i = 0; i < 4; ++i) {
    const double c = compute[i] * scale;
    v.workers.push_back(planner_worker{i, steps, c + comm, c, 0.0, c / 64});
  }
  v.live_members = 4;
  return v;
}

}  // namespace

TEST_CASE("each policy's job planner comes from its registry row, the batch allocation's beside it") {
  for (const char* p : {"bsp", "asp", "ssp", "ksync", "kasync", "ring"}) {
    fixture f(p);
    CHECK_FALSE(make_job_planner(f.ctx)->plans());
  }
  for (const char* p : {"adsp", "adaptive", "ashl"}) {
    fixture f(p);
    CHECK(make_job_planner(f.ctx)->plans());
  }
  CHECK(make_job_planner(fixture("adaptive").ctx)->wants_staleness());
  CHECK_FALSE(make_job_planner(fixture("adsp").ctx)->wants_staleness());
  // BSP with proportional batches: the batch planner alone.
  fixture bsp("bsp", "proportional");
  CHECK(make_job_planner(bsp.ctx)->plans());
  // ASHL with adaptive batches: both plan in one tick.
  fixture both("ashl", "adaptive");
  both.job.ashl.profile_steps = 3;
  auto planner = make_job_planner(both.ctx);
  job_plan start;
  planner->on_start(start);
  REQUIRE(start.shards.bound);
  job_plan plan;
  planner->on_tick(hetero(1.0, 2.0, 5), plan);
  CHECK(plan.stages.size() == 4); // ASHL left profiling
  CHECK(plan.batches.size() == 4); // shares follow speed
}

TEST_CASE("ASHL's planner ticks every 0.25 s, the others every 0.5 s, and a combination at its shortest part's") {
  CHECK(make_job_planner(fixture("adsp").ctx)->tick_ms() == planner_tick_ms);
  CHECK(make_job_planner(fixture("bsp", "proportional").ctx)->tick_ms() == planner_tick_ms);
  CHECK(make_job_planner(fixture("ashl").ctx)->tick_ms() == ashl_tick_ms);
  CHECK(make_job_planner(fixture("ashl", "adaptive").ctx)->tick_ms() == ashl_tick_ms);
  CHECK(ashl_tick_ms < planner_tick_ms);
}

TEST_CASE("policy traits: commits for adsp and ashl, a ring for ring, lockstep where workers wait for rounds") {
  CHECK(traits_of("adsp").commits);
  CHECK(traits_of("ashl").commits);
  CHECK_FALSE(traits_of("asp").commits);
  CHECK(traits_of("ring").ring);
  CHECK_FALSE(traits_of("bsp").ring);
  CHECK(traits_of("bsp").lockstep);
  CHECK(traits_of("ksync").lockstep);
  CHECK_FALSE(traits_of("asp").lockstep);
  CHECK_FALSE(traits_of("no-such-policy").lockstep);
  train_config job;
  job.policy = "ashl";
  CHECK(push_topk_ratio(job) == Approx(job.ashl.topk_ratio));
  job.topk_ratio = 0.3;
  CHECK(push_topk_ratio(job) == Approx(0.3));
  job.policy = "ring";
  CHECK(push_topk_ratio(job) == 0.0);
  job.policy = "bsp";
  job.topk_ratio = 0;
  CHECK(push_topk_ratio(job) == 0.0);
}

TEST_CASE("the ADSP planner sends each worker its local steps only when they change") {
  fixture f("adsp");
  auto planner = make_job_planner(f.ctx);
  job_plan first;
  planner->on_tick(hetero(0.5, 2.0, 10, 0.1), first); // 40, 40, 20, 10 ms per step
  REQUIRE(first.local_steps.size() == 4);
  // A 4x faster worker takes about 4x the local steps of a slow one, per commit period.
  CHECK(first.local_steps[3] >= 3 * first.local_steps[0]);
  CHECK(first.local_steps[0] == first.local_steps[1]);
  // Nothing changed since (the period moves only from the second loss rate on).
  job_plan second;
  planner->on_tick(hetero(1.0, 1.9, 20, 0.1), second);
  CHECK(second.local_steps.empty());
  CHECK_FALSE(second.debug.empty()); // the period, for the log
}

TEST_CASE("the ASHL planner announces a stage change to shards and workers, then only changed local steps") {
  fixture f("ashl");
  f.job.ashl.profile_steps = 5;
  auto planner = make_job_planner(f.ctx);
  job_plan start;
  planner->on_start(start);
  REQUIRE(start.shards.bound);
  CHECK(start.shards.bound->first == f.job.ashl.ahl_gap); // profiling: nobody waits for the slowest
  // Communication is free here, so the plan after the stage change stays as it is.
  job_plan profiling;
  planner->on_tick(hetero(0.5, 2.3, 3, 1.0, 0.0), profiling);
  CHECK(profiling.stages.empty());
  CHECK_FALSE(profiling.stage);
  job_plan ahl;
  planner->on_tick(hetero(1.0, 2.0, 6, 1.0, 0.0), ahl);
  REQUIRE(ahl.stages.size() == 4);
  REQUIRE(ahl.stage);
  CHECK(*ahl.stage == static_cast<int>(ashl_stage::ahl));
  REQUIRE(ahl.shards.bound);
  CHECK(ahl.shards.bound->first == f.job.ashl.ahl_gap);
  CHECK(ahl.stages[0].stage == "ahl");
  CHECK(ahl.stages[3].local_steps > ahl.stages[0].local_steps); // the fast worker commits less often
  REQUIRE(ahl.events.size() == 1);
  CHECK(ahl.events[0].name == "stage ahl");
  CHECK(ahl.info.size() == 2);
  // The next tick with the same figures changes nothing.
  job_plan same;
  planner->on_tick(hetero(1.5, 1.5, 12, 1.0, 0.0), same);
  CHECK(same.stages.empty());
  CHECK(same.local_steps.empty());
  CHECK(same.shards.empty());
  // A worker joining now is slotted into AHL with one local step until it has times.
  job_plan join;
  planner->on_join(7, join);
  REQUIRE(join.stages.count(7) == 1);
  CHECK(join.stages[7].stage == "ahl");
  CHECK(join.stages[7].local_steps == 1);
  // A restored shard gets AHL's bound.
  auto restored = planner->shard_state();
  REQUIRE(restored.bound);
  CHECK(restored.bound->first == f.job.ashl.ahl_gap);
}

TEST_CASE("the adaptive planner retunes the shards from recent staleness, and only when its choice changes") {
  fixture f("adaptive");
  auto planner = make_job_planner(f.ctx);
  auto view = hetero(0.5, 2.0, 10);
  view.staleness_sum = 10;
  view.pushes = 10; // mean staleness 1: late gradients are kept
  job_plan first;
  planner->on_tick(view, first);
  REQUIRE(first.shards.tune);
  CHECK(first.shards.tune->second); // async
  CHECK(first.shards.tune->first == 1); // only the fastest is within 1.5x of the fastest
  REQUIRE(first.events.size() == 1);
  CHECK(first.events[0].name == "k-async");
  // Same spread, small staleness since the last tick: no retune.
  view.staleness_sum = 20;
  view.pushes = 20;
  job_plan same;
  planner->on_tick(view, same);
  CHECK(same.shards.empty());
  // Pushes since the last tick lag by 20 versions on average: drop late gradients.
  view.staleness_sum = 20 + 200;
  view.pushes = 30;
  job_plan late;
  planner->on_tick(view, late);
  REQUIRE(late.shards.tune);
  CHECK_FALSE(late.shards.tune->second);
  REQUIRE(planner->shard_state().tune);
  CHECK_FALSE(planner->shard_state().tune->second);
}

TEST_CASE("proportional batches wait for every live worker, split the batch and the data by speed, then stay") {
  fixture f("bsp", "proportional");
  auto planner = make_job_planner(f.ctx);
  auto view = hetero(1.0, 2.0, 5);
  view.live_members = 5; // one member has no figures yet
  job_plan wait;
  planner->on_tick(view, wait);
  CHECK(wait.batches.empty());
  view.live_members = 4;
  job_plan plan;
  planner->on_tick(view, plan);
  REQUIRE(plan.batches.size() == 4);
  uint32_t sum = 0;
  uint64_t covered = 0;
  for (const auto& [id, b] : plan.batches) {
    sum += b.share;
    CHECK(b.data_begin == covered); // parts follow each other
    covered += b.data_count;
    CHECK(b.from_step == 5 + 3); // lockstep: all switch together, a few rounds ahead
  }
  CHECK(sum == 4 * 64);
  CHECK(covered == f.ctx.train_size);
  CHECK(plan.batches[3].share == Approx(4 * plan.batches[0].share).margin(2));
  REQUIRE(plan.events.size() == 1);
  CHECK(plan.events[0].name == "batch shares");
  // Profiled once: later speeds change nothing.
  auto flipped = hetero(2.0, 1.0, 10);
  std::swap(flipped.workers[0].compute_per_sample, flipped.workers[3].compute_per_sample);
  job_plan later;
  planner->on_tick(flipped, later);
  CHECK(later.batches.empty());
}

TEST_CASE("a resumed job keeps its checkpointed proportional shares when they cover the global batch") {
  fixture f("bsp", "proportional");
  f.ctx.resume_batches = {{0, 26}, {1, 26}, {2, 68}, {3, 136}};
  batch_planner restored(allocation_mode::proportional, f.ctx);
  CHECK(restored.frozen());
  job_plan start;
  restored.on_start(start);
  REQUIRE(start.info.size() == 1);
  CHECK(start.info[0].find("0:26, 1:26, 2:68, 3:136") != std::string::npos);
  f.ctx.resume_batches.erase(3); // one member missing: profiled again
  batch_planner partial(allocation_mode::proportional, f.ctx);
  CHECK_FALSE(partial.frozen());
  CHECK_FALSE(parse_allocation("fastest"));
}

TEST_CASE("adaptive batches follow the workers' speed and switch a worker at its next step") {
  fixture f("asp", "adaptive");
  auto planner = make_job_planner(f.ctx);
  job_plan plan;
  planner->on_tick(hetero(1.0, 2.0, 5), plan);
  REQUIRE(plan.batches.size() == 4);
  CHECK(plan.batches[0].from_step == 6); // not lockstep: its next step
  // The slow workers got faster than the fast one: shares follow.
  auto flipped = hetero(2.0, 1.5, 10);
  std::swap(flipped.workers[0].compute_per_sample, flipped.workers[3].compute_per_sample);
  job_plan again;
  planner->on_tick(flipped, again);
  REQUIRE(again.batches.count(0) == 1);
  CHECK(again.batches[0].share > again.batches[3].share);
}

TEST_CASE("assignment rules: fixed data slots, steps by policy and allocation, commit scale, resumed positions") {
  train_config job;
  job.workers = 4;
  job.batch_size = 100;
  job.epochs = 2;
  job.policy = "bsp";
  assignment_context ctx{&job, traits_of("bsp"), 60000, 1.0, nullptr};
  auto a = make_assignment(ctx, 2, 0);
  CHECK(a.data_begin == 30000);
  CHECK(a.data_count == 15000);
  CHECK(a.steps == 2 * 150);
  CHECK(a.commit_scale == 1.0f);
  // A fifth worker shares a slot, round robin by registrations.
  auto e = make_assignment(ctx, 4, 5);
  CHECK(e.data_begin == 15000);
  // Not lockstep: each worker may run the whole budget at its own pace.
  job.policy = "adsp";
  ctx.traits = traits_of("adsp");
  auto d = make_assignment(ctx, 0, 0);
  CHECK(d.steps == 2 * 600);
  CHECK(d.commit_scale == Approx(0.25f)); // one worker's share of a model average
  job.commit_scale = 0.5;
  CHECK(make_assignment(ctx, 0, 0).commit_scale == Approx(0.5f));
  // Unequal allocations: the whole set until the first share.
  job.policy = "bsp";
  job.allocation = allocation_mode::proportional;
  ctx.traits = traits_of("bsp");
  auto p = make_assignment(ctx, 1, 1);
  CHECK(p.data_begin == 0);
  CHECK(p.data_count == 60000);
  CHECK(p.steps == 300);
  // Resumed: half the job left, from the checkpointed position and share.
  ctx.remaining = 0.5;
  auto r = make_assignment(ctx, 1, 1);
  CHECK(r.steps == 150);
  resumed_worker was{40, wire::data_position{100, 200, 7, 3, 50}};
  REQUIRE_FALSE(apply_resumed(r, was, ctx));
  CHECK(r.batch_size == 40);
  CHECK(r.data_begin == 100);
  CHECK(r.cursor_epoch == 3);
  resumed_worker outside{40, wire::data_position{59900, 200, 7, 3, 50}};
  auto why = apply_resumed(r, outside, ctx);
  REQUIRE(why);
  CHECK(why->find("does not fit the 60000 training samples") != std::string::npos);
  CHECK(r.data_begin == 100); // left as it was
  // A late joiner trains as long as the live member with the most left.
  CHECK(steps_left({{0, 100}, {1, 100}}, {{0, 90}, {1, 40}}) == 60);
  CHECK(steps_left({{0, 100}}, {{0, 120}}) == 0);
}

TEST_CASE("a lost member's untrained share goes to the live members: the set re-split over them by batch, and under "
          "lockstep the rounds it had left spread over them") {
  // Three members of 9000 samples, batch 50, 60 rounds each; member 2 lost after 20.
  std::map<uint32_t, member_part> live{{0, {50, 0, 3000, 60}}, {1, {50, 3000, 3000, 60}}};
  const member_part lost{50, 6000, 3000, 60};
  auto h = hand_over_lost(lost, 20, live, 9000, true);
  CHECK(h.reassigned_samples == 40 * 50);
  CHECK(h.extra_rounds == 20); // 2000 samples over 2 x 50 per round
  REQUIRE(h.parts.size() == 2);
  CHECK(h.parts[0].data_begin == 0);
  CHECK(h.parts[0].data_count == 4500);
  CHECK(h.parts[1].data_begin == 4500);
  CHECK(h.parts[1].data_count == 4500);
  CHECK(h.parts[0].steps == 80);
  CHECK(h.parts[1].share == 50);
  CHECK(h.parts[1].from_step == 0);
  // Batch shares of 30 and 90 (an allocation): parts in proportion, 1:3.
  std::map<uint32_t, member_part> shares{{0, {30, 0, 3000, 60}}, {4, {90, 3000, 6000, 60}}};
  auto p = hand_over_lost(lost, 60, shares, 8000, true);
  CHECK(p.reassigned_samples == 0); // it had finished its rounds
  CHECK(p.extra_rounds == 0);
  CHECK(p.parts[0].data_count == 2000);
  CHECK(p.parts[4].data_begin == 2000);
  CHECK(p.parts[4].data_count == 6000);
  CHECK(p.parts[4].steps == 0); // steps stay
  // Not lockstep: the job runs to its sample budget, only the parts move.
  auto a = hand_over_lost(lost, 20, live, 9000, false);
  CHECK(a.reassigned_samples == 0);
  CHECK(a.parts.size() == 2);
  CHECK(a.parts[0].steps == 0);
  // Nobody left to take it.
  CHECK(hand_over_lost(lost, 20, {}, 9000, true).parts.empty());
}

TEST_CASE("a member that left is handed over from the steps it said it trained when the profiler's count lags, and "
          "one that trained all its steps hands nothing over") {
  std::map<uint32_t, member_part> live{{0, {50, 0, 3000, 60}}, {1, {50, 3000, 3000, 60}}};
  const member_part left{50, 6000, 3000, 60};
  // Removed on request after 45 steps; the profiler has counted 43 so far.
  auto r = hand_over_left(left, 45, 43, live, 9000, true);
  CHECK_FALSE(r.finished);
  CHECK(r.done_steps == 45);
  CHECK(r.h.reassigned_samples == 15 * 50);
  CHECK(r.h.extra_rounds == 8); // 750 samples over 2 x 50 per round, rounded up
  // Lost without a word (reported 0): the profiler's count is all there is.
  auto lost = hand_over_left(left, 0, 43, live, 9000, true);
  CHECK(lost.done_steps == 43);
  CHECK(lost.h.reassigned_samples == 17 * 50);
  // It said it finished its 60 steps; the profiler still counts 59: nothing is handed
  // over, no part moves.
  auto done = hand_over_left(left, 60, 59, live, 9000, true);
  CHECK(done.finished);
  CHECK(done.done_steps == 60);
  CHECK(done.h.parts.empty());
  CHECK(done.h.reassigned_samples == 0);
  // Whichever of the two is more counts.
  CHECK(hand_over_left(left, 59, 60, live, 9000, true).finished);
}

TEST_CASE("a member joining a running job gets a part of the set of its own, and only changed parts are sent") {
  std::map<uint32_t, member_part> live{{0, {50, 0, 4500, 80}}, {1, {50, 4500, 4500, 80}}, {5, {50, 0, 9000, 40}}};
  auto h = hand_over_joined(live, 9000);
  REQUIRE(h.parts.size() == 3);
  CHECK(h.parts[0].data_count == 3000);
  CHECK(h.parts[1].data_begin == 3000);
  CHECK(h.parts[5].data_begin == 6000);
  CHECK(h.parts[5].data_count == 3000);
  CHECK(h.parts[5].steps == 0);
  std::map<uint32_t, member_part> settled{{0, {50, 0, 4500, 80}}, {1, {50, 4500, 4500, 80}}};
  CHECK(hand_over_joined(settled, 9000).parts.empty());
}

TEST_CASE("a member joining a running lockstep job trains what is owed once over every live batch: the others' "
          "rounds shrink, and steps lost workers left are taken up") {
  // Two members of batch 50, 80 steps each, 20 done: 2 x 60 x 50 = 6000 samples owed.
  std::map<uint32_t, member_part> live{{0, {50, 0, 4500, 80}}, {1, {50, 4500, 4500, 80}}, {5, {100, 0, 9000, 0}}};
  std::map<uint32_t, uint64_t> done{{0, 20}, {1, 20}};
  auto j = hand_over_joined_lockstep(live, {}, done, 5, 9000);
  CHECK(j.owed_samples == 6000);
  CHECK(j.rounds == 30); // 6000 over 50 + 50 + 100 a round
  CHECK(j.h.parts[0].steps == 50); // 20 done + 30
  CHECK(j.h.parts[1].steps == 50);
  CHECK(j.h.parts[5].data_count == 4500); // the newcomer's part, in proportion to its batch
  // Every worker lost at once (2 and 3, with 40 and 45 steps left): a lone newcomer trains it all.
  std::map<uint32_t, member_part> lost{{2, {50, 0, 4500, 80}}, {3, {50, 4500, 4500, 80}}};
  std::map<uint32_t, member_part> alone{{7, {64, 0, 9000, 0}}};
  auto k = hand_over_joined_lockstep(alone, lost, {{2, 40}, {3, 35}}, 7, 9000);
  CHECK(k.owed_samples == (40 + 45) * 50);
  CHECK(k.rounds == (4250 + 63) / 64);
  // Nothing owed: the newcomer trains nothing.
  auto none = hand_over_joined_lockstep(alone, {}, {}, 7, 9000);
  CHECK(none.rounds == 0);
}

TEST_CASE("ring membership: the first ring at the start, a new one on a loss, a removal or a join, and on every leave once one happened") {
  ring_membership untouched;
  CHECK(untouched.start() == 1);
  CHECK(untouched.on_leave(false) == 0); // a job that never changed its ring: members leave together
  CHECK(untouched.on_leave(false) == 0);
  CHECK(untouched.generation() == 1);

  ring_membership lossy;
  CHECK(lossy.start() == 1);
  CHECK(lossy.on_leave(true) == 2); // lost: the others form ring 2
  CHECK(lossy.on_leave(false) == 3); // from then on a member leaving forms a new one too
  CHECK(lossy.on_leave(false) == 4);

  ring_membership grown;
  CHECK(grown.start() == 1);
  CHECK(grown.on_join() == 2);
  CHECK(grown.on_leave(false) == 3);

  ring_membership shrunk;
  CHECK(shrunk.start() == 1);
  CHECK(shrunk.on_leave(false, true) == 2); // removed before its steps were done: the others form ring 2
  CHECK(shrunk.on_leave(false) == 3);       // and from then on any leave forms one
}
