#include <catch2/catch.hpp>

#include <cmath>

#include "runtime/policy/ashl.hpp"

using namespace ashlar;

namespace {

ashl_planner make_planner(ashl_config cfg = {}) {
  auto p = ashl_planner::make(std::move(cfg));
  REQUIRE(p);
  return std::move(*p);
}

// Workers at speeds 1, 1, 2, 4: step times 0.4, 0.4, 0.2, 0.1 s, 0.05 s to communicate.
std::vector<ashl_worker> hetero(uint64_t steps) {
  return {{0, 0.4, 0.05, steps}, {1, 0.4, 0.05, steps}, {2, 0.2, 0.05, steps}, {3, 0.1, 0.05, steps}};
}

}  // namespace

TEST_CASE("the ASHL stage machine leaves profiling only when every live worker is profiled") {
  ashl_config cfg;
  cfg.profile_steps = 5;
  auto p = make_planner(cfg);
  CHECK(p.stage() == ashl_stage::profiling);
  auto w = hetero(5);
  w[1].steps = 4; // one worker still short of its profile
  CHECK_FALSE(p.observe(0.5, 2.0, w));
  CHECK(p.stage() == ashl_stage::profiling);
  for (const auto& [id, h] : p.local_steps(w))
    CHECK(h == 1); // profiling: every step communicates
  auto change = p.observe(0.7, 2.0, hetero(5));
  REQUIRE(change);
  CHECK(change->to == ashl_stage::ahl);
  CHECK(p.stage() == ashl_stage::ahl);
  CHECK(p.events().size() == 1);
}

TEST_CASE("a resumed ASHL job profiles again, then goes straight to the stage it had reached") {
  ashl_config cfg;
  cfg.profile_steps = 5;
  auto p = make_planner(cfg);
  p.resume_in(ashl_stage::shl);
  CHECK_FALSE(p.observe(0.1, 2.0, hetero(2)));
  CHECK(p.stage() == ashl_stage::profiling);
  auto change = p.observe(0.7, 2.0, hetero(5));
  REQUIRE(change);
  CHECK(change->to == ashl_stage::shl);
  CHECK(change->why.find("resumed in SHL") != std::string::npos);
  CHECK(p.lr_scale() == Approx(cfg.shl_lr_scale));
}

TEST_CASE("the ASHL stage machine moves AHL -> SHL on a loss plateau, not while the loss falls") {
  ashl_config cfg;
  cfg.plateau_window_s = 2.0;
  cfg.plateau_drop = 0.1;
  auto p = make_planner(cfg);
  CHECK(p.lr_scale() == 1.0f);
  REQUIRE(p.observe(0.5, 2.0, hetero(10)));
  CHECK(p.lr_scale() == 1.0f); // AHL: the full learning rate
  // Falling fast: 2.0 -> 1.0 over two seconds.
  double loss = 2.0;
  for (double t = 1.0; t <= 3.0; t += 0.5) {
    loss -= 0.25;
    CHECK_FALSE(p.observe(t, loss, hetero(20)));
  }
  CHECK(p.stage() == ashl_stage::ahl);
  // Flat: 1.0 -> 0.97 over two seconds, a 3% drop.
  std::optional<ashl_event> change;
  for (double t = 3.5; t <= 6.0 && !change; t += 0.5) {
    loss = std::max(0.97, loss - 0.01);
    change = p.observe(t, loss, hetero(30));
  }
  REQUIRE(change);
  CHECK(change->to == ashl_stage::shl);
  CHECK(p.stage() == ashl_stage::shl);
  CHECK(p.events().size() == 2);
  CHECK(p.lr_scale() == Approx(cfg.shl_lr_scale)); // the fine stage takes smaller steps
  // SHL is the last stage.
  CHECK_FALSE(p.observe(10.0, 0.5, hetero(40)));
}

TEST_CASE("ASHL's plateau window counts training samples, so a faster cluster is judged over fewer seconds") {
  // The same loss curve in samples (it falls 10% per 10K samples for 60K samples, then
  // levels off) on two clusters, one four times the other's throughput.
  auto loss_at = [](double samples) { return 2.0 * std::pow(0.9, std::min(samples, 60000.0) / 10000.0); };
  auto switch_at = [&](double samples_per_s, ashl_config cfg) {
    auto p = make_planner(cfg);
    REQUIRE(p.observe(0.25, 2.0, hetero(10), 0));
    for (double t = 0.5; t <= 60; t += 0.25) {
      const double n = samples_per_s * (t - 0.25);
      if (auto change = p.observe(t, loss_at(n), hetero(20), static_cast<uint64_t>(n))) {
        CHECK(change->to == ashl_stage::shl);
        return std::make_pair(t, n);
      }
    }
    FAIL("no plateau found");
    return std::make_pair(0.0, 0.0);
  };
  ashl_config cfg;
  cfg.plateau_window_epochs = 0.25; // 15K of 60K samples
  const auto [slow_t, slow_n] = switch_at(10000, cfg);
  const auto [fast_t, fast_n] = switch_at(40000, cfg);
  // Neither switched while the loss still fell 10% per window: only past 60K samples.
  CHECK(slow_n > 60000);
  CHECK(fast_n > 60000);
  // The same samples (within a window's worth), a quarter of the seconds.
  CHECK(std::abs(slow_n - fast_n) <= 15000 + 40000 * 0.25);
  CHECK(fast_t < slow_t / 2);
  // A window of fixed seconds, sized for the slow cluster (1.5 s = 15K samples there),
  // holds the fast one in AHL over 4 x the samples: it sees the plateau 40K samples late.
  ashl_config seconds;
  seconds.plateau_window_s = 1.5;
  const auto [slow_ts, slow_ns] = switch_at(10000, seconds);
  const auto [fast_ts, fast_ns] = switch_at(40000, seconds);
  CHECK(slow_ns < 60000 + 25000);
  CHECK(fast_ns > 60000 + 35000);
  (void) slow_ts;
  (void) fast_ts;
}

TEST_CASE("ASHL's plateau window must be above 0 epochs") {
  ashl_config cfg;
  cfg.plateau_window_epochs = 0;
  auto p = ashl_planner::make(cfg);
  REQUIRE_FALSE(p);
  CHECK(describe(p.error()).find("ashl.plateau_window_epochs") != std::string::npos);
}

TEST_CASE("the ASHL loss rule switches to SHL at the target loss") {
  ashl_config cfg;
  cfg.rule = ashl_rule::loss;
  cfg.switch_loss = 0.5;
  auto p = make_planner(cfg);
  REQUIRE(p.observe(0.5, 2.0, hetero(10)));
  CHECK_FALSE(p.observe(1.0, 0.8, hetero(20)));
  CHECK_FALSE(p.observe(1.5, 0.51, hetero(30)));
  auto change = p.observe(2.0, 0.49, hetero(40));
  REQUIRE(change);
  CHECK(change->to == ashl_stage::shl);
}

TEST_CASE("ASHL's local steps make H_i x t_i + comm_i equal across workers, and the gap follows the stage") {
  ashl_config cfg;
  cfg.ahl_local_steps = 4;
  cfg.shl_local_steps = 1;
  cfg.ahl_gap = 16;
  cfg.shl_gap = 2;
  cfg.plateau_window_s = 1.0;
  auto p = make_planner(cfg);
  CHECK(p.allowed_gap() == 16); // profiling: nobody waits for the slowest
  REQUIRE(p.observe(0.5, 1.0, hetero(10)));
  CHECK(p.allowed_gap() == 16);
  auto h = p.local_steps(hetero(10));
  // Period = 4 x 0.4 + 0.05 = 1.65 s: H = round((1.65 - 0.05) / t) = 4, 4, 8, 16.
  CHECK(h.at(0) == 4);
  CHECK(h.at(1) == 4);
  CHECK(h.at(2) == 8);
  CHECK(h.at(3) == 16);
  for (const auto& w : hetero(10)) {
    double commit_time = h.at(w.id) * w.step_s + w.comm_s;
    CHECK(commit_time == Approx(1.65).epsilon(0.05));
  }
  // A worker without a time yet (joined late) is profiled first: one step per commit.
  auto late = hetero(10);
  late.push_back({7, 0.0, 0.0, 0});
  CHECK(p.local_steps(late).at(7) == 1);
  CHECK_FALSE(p.observe(1.0, 1.0, hetero(20))); // no loss a window old yet
  REQUIRE(p.observe(2.5, 1.0, hetero(30))); // flat: SHL
  CHECK(p.stage() == ashl_stage::shl);
  CHECK(p.allowed_gap() == 2);
  auto s = p.local_steps(hetero(30));
  CHECK(s.at(0) == 1); // period 0.45 s
  CHECK(s.at(3) == 4);
}

TEST_CASE("ASHL settings that cannot work are refused, naming the key") {
  auto p = parse_ashl_rule("sometimes"); // a rule is a mode: refused as it is parsed
  REQUIRE_FALSE(p);
  CHECK(describe(p.error()).find("train.ashl.rule") == std::string::npos);
  CHECK(describe(p.error()).find("ashl.rule") != std::string::npos);
  ashl_config zero;
  zero.ahl_local_steps = 0;
  CHECK_FALSE(ashl_planner::make(zero));
  ashl_config no_lr;
  no_lr.shl_lr_scale = 0;
  auto q = ashl_planner::make(no_lr);
  REQUIRE_FALSE(q);
  CHECK(describe(q.error()).find("ashl.shl_lr_scale") != std::string::npos);
}

TEST_CASE("the ashl policy is in the registry and moves its staleness bound at run time") {
  policy_config pc;
  pc.staleness_bound = 0;
  auto made = make_policy("ashl", pc);
  REQUIRE(made);
  auto& pol = **made;
  CHECK(std::string{pol.name()} == "ashl");
  pol.on_join(0);
  pol.on_join(1);
  pol.on_push(0, 0, 0);
  CHECK_FALSE(pol.may_read(0, 1)); // one commit ahead with bound 0
  pol.set_staleness_bound(1);
  CHECK(pol.may_read(0, 1));
}

TEST_CASE("ASHL compresses pulls by default and, with a threshold, only where profiling found communication costly") {
  // By default pulls are compressed however cheap communication is.
  auto always = make_planner();
  CHECK(always.pull_ratio() == 0.0f); // dense while profiling
  auto first = always.observe(0.7, 2.0, hetero(5));
  REQUIRE(first);
  CHECK(always.pull_ratio() == Approx(0.1f));
  CHECK(first->why.find("pulls are delta reads of 10.0% (communication 50.0 ms per commit, 0.125 of") != std::string::npos);
  // Communication per commit against the slowest worker's compute per step (0.4 s):
  // 0.05 s is 0.125 of it, below a threshold of 0.25, so pulls stay dense.
  ashl_config threshold;
  threshold.pull_compress_above = 0.25;
  auto cheap = make_planner(threshold);
  CHECK(cheap.pull_ratio() == 0.0f);
  auto change = cheap.observe(0.7, 2.0, hetero(5));
  REQUIRE(change);
  CHECK(cheap.pull_ratio() == 0.0f);
  CHECK(change->why.find("pulls stay dense (communication 50.0 ms per commit, 0.125 of") != std::string::npos);
  // A slow link: 0.3 s per commit is 0.75 of the slowest step: delta reads of 10%.
  auto costly = make_planner(threshold);
  auto slow = hetero(5);
  for (auto& w : slow)
    w.comm_s = 0.3;
  change = costly.observe(0.7, 2.0, slow);
  REQUIRE(change);
  CHECK(costly.pull_ratio() == Approx(0.1f));
  CHECK(change->why.find("pulls are delta reads of 10.0% (communication 300.0 ms per commit, 0.750") != std::string::npos);
  // pull_topk_ratio 0 keeps them dense whatever the cost; the threshold is a setting.
  ashl_config off;
  off.pull_topk_ratio = 0;
  auto never = make_planner(off);
  REQUIRE(never.observe(0.7, 2.0, slow));
  CHECK(never.pull_ratio() == 0.0f);
  ashl_config low;
  low.pull_compress_above = 0.1;
  auto eager = make_planner(low);
  REQUIRE(eager.observe(0.7, 2.0, hetero(5)));
  CHECK(eager.pull_ratio() == Approx(0.1f));
  // Bad settings are refused, naming the key.
  ashl_config bad;
  bad.pull_topk_ratio = 0.5;
  auto refused = ashl_planner::make(bad);
  REQUIRE_FALSE(refused);
  CHECK(describe(refused.error()).find("ashl.pull_topk_ratio") != std::string::npos);
}

TEST_CASE("on a slow network ASHL's slowest worker takes enough local steps to keep communication to its share") {
  ashl_config cfg;
  cfg.rule = ashl_rule::loss;
  cfg.switch_loss = 1.0;
  cfg.shl_local_steps = 1;
  auto p = make_planner(cfg);
  auto slow_net = hetero(10);
  for (auto& w : slow_net)
    w.comm_s = 0.4; // as long as the slowest worker's step
  REQUIRE(p.observe(0.5, 2.0, slow_net));
  REQUIRE(p.observe(1.0, 0.9, slow_net)); // SHL
  auto h = p.local_steps(slow_net);
  // comm / (H x 0.4 + 0.4) <= 0.25 needs H >= 3: period 1.6 s, of which 0.4 s talking.
  CHECK(h.at(0) == 3);
  CHECK(h.at(3) == 12);
  for (const auto& w : slow_net)
    CHECK(h.at(w.id) * w.step_s + w.comm_s == Approx(1.6).epsilon(0.05));
  // On a fast network the stage's H stands; with no limit (share 1) it stands anyway.
  CHECK(p.local_steps(hetero(10)).at(0) == 1);
  ashl_config open = cfg;
  open.max_comm_share = 1;
  auto q = make_planner(open);
  REQUIRE(q.observe(0.5, 2.0, slow_net));
  REQUIRE(q.observe(1.0, 0.9, slow_net));
  CHECK(q.local_steps(slow_net).at(0) == 1);
}
