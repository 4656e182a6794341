#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "runtime/policy/adaptive_k.hpp"
#include "runtime/policy/adsp.hpp"
#include "runtime/policy/asp.hpp"
#include "runtime/policy/bsp.hpp"
#include "runtime/policy/k_sync.hpp"
#include "runtime/policy/ssp.hpp"
#include "runtime/policy/sync_policy.hpp"

using namespace ashlar;

TEST_CASE("the registry makes each policy by name and refuses unknown names") {
  for (const auto& name : policy_names()) {
    auto p = make_policy(name, {});
    REQUIRE(p);
    CHECK((*p)->name() == name);
  }
  auto bad = make_policy("nope", {});
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), errc::unknown_name));
}

TEST_CASE("BSP buffers pushes until every live worker has pushed, then the round is ready") {
  bsp_policy p;
  p.on_join(0);
  p.on_join(1);
  p.on_join(2);
  CHECK(p.on_push(0, 0, 0).kind == push_decision::buffer);
  CHECK_FALSE(p.round_ready());
  CHECK(p.on_push(2, 0, 0).kind == push_decision::buffer);
  CHECK_FALSE(p.round_ready());
  // Worker 0 has pushed: it may not read version 0 again, worker 1 may.
  CHECK_FALSE(p.may_read(0, 0));
  CHECK(p.may_read(1, 0));
  CHECK(p.on_push(1, 0, 0).kind == push_decision::buffer);
  CHECK(p.round_ready());
  p.on_round_applied();
  CHECK(p.may_read(0, 1));
  CHECK_FALSE(p.round_ready());
}

TEST_CASE("BSP stops waiting for a worker that leaves") {
  bsp_policy p;
  p.on_join(0);
  p.on_join(1);
  p.on_push(0, 0, 0);
  CHECK_FALSE(p.round_ready());
  p.on_leave(1);
  CHECK(p.round_ready());
}

TEST_CASE("BSP drops a second push in one round and a push from an old version") {
  bsp_policy p;
  p.on_join(0);
  p.on_join(1);
  CHECK(p.on_push(0, 0, 0).kind == push_decision::buffer);
  CHECK(p.on_push(0, 0, 0).kind == push_decision::drop);
  auto d = p.on_push(1, 0, 3);
  CHECK(d.kind == push_decision::drop);
  CHECK(d.staleness == 3);
}

TEST_CASE("ASP applies every push at once and records its staleness") {
  asp_policy p{{}};
  p.on_join(0);
  auto d = p.on_push(0, 2, 7);
  CHECK(d.kind == push_decision::apply);
  CHECK(d.staleness == 5);
  CHECK(d.lr_scale == 1.0f);
  CHECK(p.may_read(0, 0));
  CHECK_FALSE(p.round_ready());
}

TEST_CASE("ASP with a staleness-aware learning rate divides it by 1 + staleness") {
  policy_config cfg;
  cfg.staleness_aware_lr = true;
  asp_policy p{cfg};
  CHECK(p.on_push(0, 7, 7).lr_scale == 1.0f);
  CHECK(p.on_push(0, 4, 7).lr_scale == Approx(0.25f));
}

TEST_CASE("SSP blocks a worker exactly s clocks ahead and releases it when the slowest catches up") {
  policy_config cfg;
  cfg.staleness_bound = 2;
  ssp_policy p{cfg};
  p.on_join(0);
  p.on_join(1);
  // Worker 0 pushes twice: 2 ahead of worker 1, still within the bound.
  CHECK(p.on_push(0, 0, 0).kind == push_decision::apply);
  CHECK(p.on_push(0, 1, 1).kind == push_decision::apply);
  CHECK(p.may_read(0, 2));
  // A third push puts it 3 ahead: it must wait.
  p.on_push(0, 2, 2);
  CHECK(p.clock(0) == 3);
  CHECK_FALSE(p.may_read(0, 3));
  CHECK(p.may_read(1, 3));
  // The slowest worker pushes once: worker 0 is 2 ahead again and is released.
  p.on_push(1, 0, 3);
  CHECK(p.may_read(0, 4));
}

TEST_CASE("SSP with bound 0 keeps workers in lockstep, and a leaving worker stops holding others back") {
  policy_config cfg;
  cfg.staleness_bound = 0;
  ssp_policy p{cfg};
  p.on_join(0);
  p.on_join(1);
  p.on_push(0, 0, 0);
  CHECK_FALSE(p.may_read(0, 1));
  p.on_leave(1);
  CHECK(p.may_read(0, 1));
}

TEST_CASE("SSP starts a late worker at the slowest clock, so it holds nobody back") {
  policy_config cfg;
  cfg.staleness_bound = 1;
  ssp_policy p{cfg};
  p.on_join(0);
  for (int i = 0; i < 5; ++i)
    p.on_push(0, 0, 0);
  p.on_join(1);
  CHECK(p.clock(1) == 5);
  CHECK(p.may_read(0, 5));
}

TEST_CASE("SSP counts a bound from when it is set, so a lead built under a wider one holds nobody back") {
  policy_config cfg;
  cfg.staleness_bound = 16;
  ssp_policy p{cfg};
  auto pushes = [&](worker_id w, int n) {
    for (int i = 0; i < n; ++i)
      p.on_push(w, 0, 0);
  };
  p.on_join(0);
  p.on_join(1);
  p.on_join(2);
  pushes(0, 10); // worker 0 is 10 ahead of the slowest
  pushes(1, 3);
  CHECK(p.may_read(0, 13));
  // Narrowed to 2 (ASHL's switch to SHL): the lead is forgotten, nobody is held.
  p.set_staleness_bound(2);
  CHECK((p.clock(0) == 0 && p.clock(1) == 0 && p.clock(2) == 0));
  CHECK((p.may_read(0, 13) && p.may_read(1, 13)));
  // From here on the new bound holds: 3 ahead waits, and is let go when the slowest pushes.
  pushes(0, 3);
  CHECK_FALSE(p.may_read(0, 16));
  pushes(1, 1);
  CHECK_FALSE(p.may_read(0, 17)); // worker 2 is still the slowest
  pushes(2, 1);
  CHECK(p.may_read(0, 18));
  // A stage with the same gap as the last starts level too.
  p.set_staleness_bound(2);
  CHECK((p.clock(0) == 1 && p.clock(1) == 1 && p.clock(2) == 1));
  CHECK(p.may_read(0, 19));
}

TEST_CASE("k-sync applies the round after the first k gradients and drops the late one") {
  policy_config cfg;
  cfg.k = 2;
  k_sync_policy p{cfg};
  for (worker_id w : {0u, 1u, 2u})
    p.on_join(w);
  CHECK(p.on_push(2, 0, 0).kind == push_decision::buffer);
  CHECK_FALSE(p.round_ready());
  CHECK_FALSE(p.may_read(2, 0)); // pushed: waits for the round, like BSP
  CHECK(p.on_push(0, 0, 0).kind == push_decision::buffer);
  CHECK(p.round_ready());
  p.on_round_applied();
  CHECK(p.may_read(2, 1));
  // Worker 1 computed from version 0 too, but the round is gone: its gradient is dropped,
  // and it may read the new version at once.
  auto late = p.on_push(1, 0, 1);
  CHECK(late.kind == push_decision::drop);
  CHECK(late.staleness == 1);
  CHECK(p.may_read(1, 1));
}

TEST_CASE("k-sync with k of 0 waits for half the live workers, rounded up") {
  k_sync_policy p{{}};
  for (worker_id w : {0u, 1u, 2u, 3u, 4u})
    p.on_join(w);
  CHECK(p.k() == 3);
  p.on_leave(4);
  p.on_leave(3);
  CHECK(p.k() == 2);
}

TEST_CASE("k-async buffers stale gradients too and applies once k have arrived") {
  policy_config cfg;
  cfg.k = 2;
  k_async_policy p{cfg};
  p.on_join(0);
  p.on_join(1);
  auto stale = p.on_push(0, 3, 5);
  CHECK(stale.kind == push_decision::buffer);
  CHECK(stale.staleness == 2);
  CHECK(p.may_read(0, 5)); // nobody waits
  CHECK_FALSE(p.round_ready());
  p.on_push(0, 5, 5); // the same worker again: counted, not lost
  CHECK(p.round_ready());
  p.on_round_applied();
  CHECK_FALSE(p.round_ready());
}

TEST_CASE("ADSP's commit intervals equalize commit counts across workers of different speeds") {
  adsp_planner planner;
  // Iteration times of workers at speeds 1, 1, 2, 4.
  std::map<worker_id, double> t = {{0, 0.032}, {1, 0.032}, {2, 0.016}, {3, 0.008}};
  auto h = planner.local_steps(t);
  CHECK(h[3] > h[2]);
  CHECK(h[2] > h[0]);
  // Simulate 60 s of training: each worker commits every h_i iterations.
  std::map<worker_id, int> commits;
  for (const auto& [w, ti] : t)
    commits[w] = static_cast<int>(60.0 / (ti * h[w]));
  int lo = 1 << 30, hi = 0;
  for (const auto& [w, c] : commits) {
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  CHECK(lo > 0);
  CHECK(static_cast<double>(hi) / lo < 1.15);
  // Without local steps (one commit per iteration) the fastest would commit 4x as often.
  CHECK(60.0 / t[3] / (60.0 / t[0]) == Approx(4.0));
}

TEST_CASE("ADSP gives one local step to workers with no time yet and caps the rest") {
  adsp_config cfg;
  cfg.max_local_steps = 8;
  adsp_planner planner{cfg};
  auto h = planner.local_steps({{0, 0.0}, {1, 1e-6}, {2, 10.0}});
  CHECK(h[0] == 1);
  CHECK(h[1] == 8);
  CHECK(h[2] == 1);
}

TEST_CASE("ADSP's commit-period search moves toward the period that makes the most progress") {
  // Progress rate (loss drop per second) peaks at a period of 0.8 s; start far below it.
  adsp_config cfg;
  cfg.initial_period_s = 0.05;
  adsp_planner planner{cfg};
  double t = 0, loss = 100;
  for (int i = 0; i < 60; ++i) {
    // The scheduler observes, sets the period, and the next interval runs at it.
    planner.observe(t, loss);
    double p = planner.period();
    double rate = 1.0 / (1.0 + std::pow(std::log(p / 0.8), 2));
    t += 1;
    loss -= rate;
  }
  CHECK(planner.period() > 0.3);
  CHECK(planner.period() < 2.0);
  // The shard side applies every commit at once, recording its staleness.
  adsp_policy shard;
  shard.on_join(0);
  auto d = shard.on_push(0, 3, 7);
  CHECK(d.kind == push_decision::apply);
  CHECK(d.staleness == 4);
  CHECK(shard.may_read(0, 7));
  CHECK_FALSE(shard.lockstep());
}

TEST_CASE("adaptive k moves with the observed spread of iteration times") {
  adaptive_k_planner planner;
  auto k_for = [&](std::vector<double> t) {
    std::vector<worker_timing> w;
    for (size_t i = 0; i < t.size(); ++i)
      w.push_back(worker_timing{static_cast<worker_id>(i), t[i]});
    return planner.choose(w, 0.0).k;
  };
  CHECK(k_for({1, 1, 1, 1}) == 4);         // no spread: wait for everyone (BSP)
  CHECK(k_for({1, 1, 1, 0.8}) == 4);       // small spread: still cheap to wait
  CHECK(k_for({1, 1, 0.5, 0.5}) == 2);     // two slow workers left out
  CHECK(k_for({1, 1, 0.5, 0.25}) == 1);    // speeds 1,1,2,4: only the fastest
  CHECK(k_for({0, 0, 0, 0}) == 4);         // nothing measured yet
  // As one worker slows down step by step, k falls and never rises.
  uint32_t last = 4;
  for (double slow : {1.0, 1.3, 1.6, 2.0, 4.0}) {
    auto k = k_for({1, 1, 1, slow});
    CHECK(k <= last);
    last = k;
  }
  CHECK(last == 3);
}

TEST_CASE("adaptive k keeps late gradients while staleness is small and drops them when it is not") {
  adaptive_k_planner planner;
  std::vector<worker_timing> w = {{0, 1.0}, {1, 1.0}};
  CHECK(planner.choose(w, 1.0).async);
  CHECK_FALSE(planner.choose(w, 10.0).async);
}

TEST_CASE("an adaptive shard policy switches k and mode only at a round boundary") {
  adaptive_k_policy p{policy_config{}};
  for (worker_id w : {0u, 1u, 2u})
    p.on_join(w);
  p.tune(2, false); // k-sync, k = 2
  CHECK_FALSE(p.async());
  CHECK(p.k() == 2);
  CHECK(p.on_push(0, 0, 0).kind == push_decision::buffer);
  p.tune(1, true); // arrives mid-round: waits for the boundary
  CHECK_FALSE(p.async());
  CHECK(p.on_push(1, 0, 0).kind == push_decision::buffer);
  REQUIRE(p.round_ready());
  p.on_round_applied();
  CHECK(p.async());
  CHECK(p.k() == 1);
  // Now k-async: the late worker's gradient for version 0 is kept, and is a round alone.
  auto d = p.on_push(2, 0, 1);
  CHECK(d.kind == push_decision::buffer);
  CHECK(d.staleness == 1);
  CHECK(p.round_ready());
  CHECK(p.may_read(2, 1));
}
