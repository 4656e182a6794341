#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "runtime/server/shard_core.hpp"

using namespace ashlar;

namespace {

shard_core make_shard(const std::string& policy, size_t n, policy_config pc = {}) {
  sgd_config opt;
  opt.lr = 0.5f;
  opt.momentum = 0.0f;
  opt.weight_decay = 0.0f;
  auto p = make_policy(policy, pc);
  REQUIRE(p);
  return shard_core{shard_range{0, 0, n}, std::vector<float>(n, 1.0f), opt, std::move(*p)};
}

}  // namespace

TEST_CASE("a BSP shard applies a version only when every live worker has pushed") {
  auto s = make_shard("bsp", 2);
  s.join(0);
  s.join(1);
  s.join(2);
  std::vector<float> g0{1, 2}, g1{3, 4}, g2{5, 6};
  auto r = s.push(0, 0, 10, g0.data(), 2);
  REQUIRE(r);
  CHECK_FALSE(r->version_bumped);
  CHECK(s.version() == 0);
  CHECK(s.params() == std::vector<float>{1, 1});
  REQUIRE(s.push(1, 0, 10, g1.data(), 2));
  CHECK(s.version() == 0);
  CHECK_FALSE(s.may_read(0));
  r = s.push(2, 0, 20, g2.data(), 2);
  REQUIRE(r);
  CHECK(r->version_bumped);
  CHECK(s.version() == 1);
  // Batch-weighted mean: (10*g0 + 10*g1 + 20*g2) / 40 = {3.5, 4.5}; w = 1 - 0.5 * mean.
  CHECK(s.params()[0] == Approx(1 - 0.5 * 3.5));
  CHECK(s.params()[1] == Approx(1 - 0.5 * 4.5));
  CHECK(s.may_read(0));
  CHECK(s.counters().applied == 3);
}

TEST_CASE("a BSP round completes when its last missing worker leaves") {
  auto s = make_shard("bsp", 1);
  s.join(0);
  s.join(1);
  float g = 1;
  REQUIRE(s.push(0, 0, 1, &g, 1));
  CHECK(s.version() == 0);
  CHECK(s.leave(1));
  CHECK(s.version() == 1);
}

TEST_CASE("a BSP shard gives bit-identical parameters whatever order the pushes arrive in") {
  const size_t n = 257;
  std::vector<std::vector<float>> grads(4, std::vector<float>(n));
  for (size_t w = 0; w < 4; ++w)
    for (size_t i = 0; i < n; ++i)
      grads[w][i] = std::sin(static_cast<float>(w * 1000 + i)) * 1e3f + 1e-3f * i;
  auto run = [&](std::vector<uint32_t> order) {
    auto s = make_shard("bsp", n);
    for (uint32_t w = 0; w < 4; ++w)
      s.join(w);
    for (int round = 0; round < 3; ++round)
      for (auto w : order)
        REQUIRE(s.push(w, s.version(), 16 + w, grads[w].data(), n));
    return s.params();
  };
  auto a = run({0, 1, 2, 3});
  auto b = run({3, 1, 0, 2});
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("an ASP shard applies each push on arrival and records its staleness") {
  auto s = make_shard("asp", 1);
  s.join(0);
  s.join(1);
  float g = 1;
  auto r0 = s.push(0, 0, 1, &g, 1);
  REQUIRE(r0);
  CHECK(r0->version_bumped);
  CHECK(r0->staleness == 0);
  auto r1 = s.push(1, 0, 1, &g, 1); // computed at 0, shard now at 1
  REQUIRE(r1);
  CHECK(r1->staleness == 1);
  CHECK(s.version() == 2);
  CHECK(s.counters().staleness_sum == 1);
  CHECK(s.counters().staleness_max == 1);
  CHECK(s.params()[0] == Approx(0.0f));
}

TEST_CASE("a stage's learning-rate factor scales every update from then on") {
  auto s = make_shard("asp", 1);
  s.join(0);
  float g = 1;
  REQUIRE(s.push(0, 0, 1, &g, 1));
  CHECK(s.params()[0] == Approx(0.5f)); // 1 - 0.5 x 1
  s.set_lr_scale(0.5f);
  REQUIRE(s.push(0, 1, 1, &g, 1));
  CHECK(s.params()[0] == Approx(0.25f)); // 0.5 - 0.5 x 0.5 x 1
}

TEST_CASE("a shard refuses a gradient of the wrong length, from a non-member or from the future") {
  auto s = make_shard("asp", 3);
  s.join(0);
  std::vector<float> g(2, 1.0f);
  auto r = s.push(0, 0, 1, g.data(), 2);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::shape_mismatch));
  CHECK(describe(r.error()).find("2 floats from worker 0, its range holds 3") != std::string::npos);
  g.resize(3);
  r = s.push(9, 0, 1, g.data(), 3);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::invalid_state));
  r = s.push(0, 5, 1, g.data(), 3);
  REQUIRE_FALSE(r);
  CHECK(describe(r.error()).find("future version 5") != std::string::npos);
  CHECK(s.version() == 0);
  CHECK(s.params() == std::vector<float>(3, 1.0f));
}

TEST_CASE("a k-async shard keeps two gradients of one worker in the same round") {
  policy_config pc;
  pc.k = 2;
  sgd_config opt;
  opt.lr = 1.0f;
  opt.momentum = 0.0f;
  opt.weight_decay = 0.0f;
  auto p = make_policy("kasync", pc);
  REQUIRE(p);
  shard_core s{shard_range{0, 0, 1}, {0.0f}, opt, std::move(*p)};
  s.join(0);
  s.join(1);
  float g1 = 1.0f, g2 = 3.0f;
  REQUIRE(s.push(0, 0, 1, &g1, 1));
  CHECK(s.version() == 0);
  auto r = s.push(0, 0, 1, &g2, 1);
  REQUIRE(r);
  CHECK(r->version_bumped);
  CHECK(s.params()[0] == Approx(-2.0f)); // mean of 1 and 3
}

TEST_CASE("a shard never writes a parameter version that a reader still holds") {
  auto s = make_shard("asp", 3);
  s.join(0);
  auto held = s.shared_params();
  const float* before = held.data();
  std::vector<float> g{1, 1, 1};
  REQUIRE(s.push(0, 0, 1, g.data(), 3));
  CHECK(held == std::vector<float>(3, 1.0f)); // the reader's version is as it was read
  CHECK(s.params() == std::vector<float>(3, 0.5f));
  CHECK(s.params().data() != before);
  held = {};
  // Nobody holds the current version: the next update is written in place.
  const float* current = s.params().data();
  REQUIRE(s.push(0, 1, 1, g.data(), 3));
  CHECK(s.params().data() == current);
  CHECK(s.params() == std::vector<float>(3, 0.0f));
}

TEST_CASE("a shard keeps its versions in the storage it is given, copies a held version into another of its "
          "buffers, and stays on the heap where the storage gives none") {
  auto s = make_shard("asp", 3);
  s.join(0);
  // A storage that hands out buffers it can tell apart (as the job's shared memory does).
  std::vector<const float*> made;
  std::vector<std::unique_ptr<float[]>> pool; // freed at the end only (no address comes twice)
  size_t asked = 0;
  bool gives = true;
  s.use_storage([&](size_t n) -> std::shared_ptr<float> {
    ++asked;
    CHECK(n == 3);
    if (!gives)
      return nullptr;
    pool.emplace_back(new float[n]);
    made.push_back(pool.back().get());
    return std::shared_ptr<float>(pool.back().get(), [](float*) {}); // (a held buffer is never written)
  });
  REQUIRE(made.size() == 1); // the current version moved there at once
  CHECK(s.params().data() == made[0]);
  CHECK(s.params() == std::vector<float>(3, 1.0f));
  std::vector<float> g{1, 1, 1};
  auto held = s.shared_params(); // a reader holds version 0: the update goes to a new buffer of the storage
  REQUIRE(s.push(0, 0, 1, g.data(), 3));
  REQUIRE(made.size() == 2);
  CHECK(s.params().data() == made[1]);
  CHECK(held == std::vector<float>(3, 1.0f));
  CHECK(s.params() == std::vector<float>(3, 0.5f));
  held = {};
  REQUIRE(s.push(0, 1, 1, g.data(), 3)); // nobody holds it: in place
  CHECK(made.size() == 2);
  CHECK(s.params().data() == made[1]);
  // A restore lands in the storage too.
  REQUIRE_FALSE(s.restore(5, std::vector<float>{7, 8, 9}, {}));
  REQUIRE(made.size() == 3);
  CHECK(s.params().data() == made[2]);
  CHECK(s.params() == std::vector<float>{7, 8, 9});
  // A storage that gives nothing (full, or the range too small to share): the heap.
  gives = false;
  held = s.shared_params();
  REQUIRE(s.push(0, 5, 1, g.data(), 3));
  CHECK(s.params() == std::vector<float>{6.5f, 7.5f, 8.5f});
  for (const float* b : made)
    CHECK(s.params().data() != b);
  CHECK(held == std::vector<float>{7, 8, 9});
  CHECK(asked == 4);
}

TEST_CASE("parameters taken while a push is applied in pieces (a checkpoint's) stay as they were taken") {
  auto s = make_shard("asp", 4);
  s.join(0);
  REQUIRE(s.begin_push(0, 0, 1, 4));
  std::vector<float> g{1, 1};
  REQUIRE(s.push_piece(0, 0, g.data(), 2));
  auto taken = s.shared_params();
  REQUIRE(s.push_piece(0, 2, g.data(), 2));
  CHECK(taken == std::vector<float>{0.5f, 0.5f, 1, 1});
  CHECK(s.params() == std::vector<float>(4, 0.5f));
}

TEST_CASE("a push in pieces is applied as it arrives and makes one version at its last piece") {
  auto s = make_shard("asp", 4);
  s.join(0);
  std::vector<float> g{1, 2, 3, 4};
  auto begun = s.begin_push(0, 0, 8, 4);
  REQUIRE(begun);
  CHECK(begun->kind == push_decision::apply);
  CHECK(s.applying());
  auto first = s.push_piece(0, 0, g.data(), 2);
  REQUIRE(first);
  CHECK_FALSE(first->version_bumped);
  CHECK(s.version() == 0);
  // A piece that is not where the last one ended is refused, naming the expected offset.
  auto gap = s.push_piece(0, 3, g.data() + 3, 1);
  REQUIRE_FALSE(gap);
  CHECK(is(gap.error(), errc::shape_mismatch));
  auto last = s.push_piece(0, 2, g.data() + 2, 2);
  REQUIRE(last);
  CHECK(last->version_bumped);
  CHECK_FALSE(s.applying());
  CHECK(s.version() == 1);
  CHECK(s.params() == std::vector<float>{0.5f, 0.0f, -0.5f, -1.0f});
  // A piece without a push begun is refused.
  CHECK_FALSE(s.push_piece(0, 0, g.data(), 1));
}

TEST_CASE("a BSP round built from pushes in pieces equals the round from whole pushes") {
  const size_t n = 10;
  std::vector<float> g0(n), g1(n);
  for (size_t i = 0; i < n; ++i) {
    g0[i] = 0.1f * static_cast<float>(i);
    g1[i] = 1.0f - 0.3f * static_cast<float>(i);
  }
  auto whole = make_shard("bsp", n);
  auto pieces = make_shard("bsp", n);
  for (auto* s : {&whole, &pieces}) {
    s->join(0);
    s->join(1);
  }
  REQUIRE(whole.push(0, 0, 3, g0.data(), n));
  REQUIRE(whole.push(1, 0, 5, g1.data(), n));
  REQUIRE(pieces.begin_push(0, 0, 3, n));
  REQUIRE(pieces.begin_push(1, 0, 5, n));
  REQUIRE(pieces.push_piece(1, 0, g1.data(), 4));
  REQUIRE(pieces.push_piece(0, 0, g0.data(), 7));
  REQUIRE(pieces.push_piece(1, 4, g1.data() + 4, 6));
  CHECK(pieces.version() == 0); // worker 0's gradient is not whole yet
  auto last = pieces.push_piece(0, 7, g0.data() + 7, 3);
  REQUIRE(last);
  CHECK(last->version_bumped);
  CHECK(pieces.params() == whole.params());
}

TEST_CASE("a BSP round does not apply a gradient whose worker left halfway through pushing it") {
  auto s = make_shard("bsp", 4);
  s.join(0);
  s.join(1);
  std::vector<float> g0{1, 1, 1, 1}, g1{8, 8, 8, 8};
  REQUIRE(s.push(0, 0, 1, g0.data(), 4));
  REQUIRE(s.begin_push(1, 0, 1, 4));
  REQUIRE(s.push_piece(1, 0, g1.data(), 2));
  CHECK(s.leave(1));
  CHECK(s.version() == 1);
  CHECK(s.params() == std::vector<float>(4, 0.5f)); // worker 0's gradient alone
}

namespace {

// Three workers, k = 2: worker 1 leaves halfway through its push, worker 2 pushes whole,
// and only worker 0's push completes the round, the mean of the two whole gradients.
void check_round_of_whole_gradients(shard_core& s) {
  for (worker_id w : {0u, 1u, 2u})
    s.join(w);
  std::vector<float> g0{4, 4, 4, 4}, g1{8, 8, 8, 8}, g2{2, 2, 2, 2};
  REQUIRE(s.begin_push(1, 0, 1, 4));
  REQUIRE(s.push_piece(1, 0, g1.data(), 2));
  CHECK_FALSE(s.leave(1)); // half a gradient: no round
  REQUIRE(s.push(2, 0, 1, g2.data(), 4));
  CHECK(s.version() == 0); // one whole gradient of the two a round needs
  auto r = s.push(0, 0, 1, g0.data(), 4);
  REQUIRE(r);
  CHECK(r->version_bumped);
  CHECK(s.params() == std::vector<float>(4, 1.0f - 0.5f * 3.0f)); // the mean of 2 and 4
}

}  // namespace

TEST_CASE("a k-async round counts only whole gradients: a push cut short by its worker leaving is not one of its k") {
  policy_config pc;
  pc.k = 2;
  auto s = make_shard("kasync", 4, pc);
  check_round_of_whole_gradients(s);
}

TEST_CASE("a k-sync round counts only whole gradients: a push cut short by its worker leaving is not one of its k") {
  policy_config pc;
  pc.k = 2;
  auto s = make_shard("ksync", 4, pc);
  check_round_of_whole_gradients(s);
}

TEST_CASE("an adaptive round in either mode counts only whole gradients: a push cut short is not one of its k") {
  for (bool async : {false, true}) {
    INFO((async ? "k-async" : "k-sync"));
    policy_config pc;
    pc.k = 2;
    auto s = make_shard("adaptive", 4, pc);
    s.tune(2, async);
    check_round_of_whole_gradients(s);
  }
}

TEST_CASE("a shard keeping a running average moves it toward each version by the samples it applied") {
  // lr 0.5, no momentum or decay: a push of gradient g moves the parameters by -0.5 g.
  auto s = make_shard("asp", 2);
  s.join(0);
  s.keep_average(100); // half-life in samples
  REQUIRE(s.keeps_average());
  CHECK(s.average_copy() == std::vector<float>{1, 1});
  std::vector<float> g{2, -2};
  double a0 = 1, a1 = 1;
  auto expect = [&](double step, double p0, double p1) {
    a0 += step * (p0 - a0);
    a1 += step * (p1 - a1);
    auto avg = s.average_copy();
    CHECK(avg[0] == Approx(a0).epsilon(1e-6));
    CHECK(avg[1] == Approx(a1).epsilon(1e-6));
  };
  // 500 samples: the half-life is at most a tenth of the samples applied (50 < 100), so
  // the average moves by 1 - 0.5^(500 / 50) toward the parameters (0, 2).
  REQUIRE(s.push(0, 0, 500, g.data(), 2));
  CHECK(s.params() == std::vector<float>{0, 2});
  expect(1 - std::exp2(-10.0), 0, 2);
  // 100 more (600 applied): the half-life is 60, still the cap.
  REQUIRE(s.push(0, 1, 100, g.data(), 2));
  expect(1 - std::exp2(-100.0 / 60), -1, 3);
  // 1000 more (1600 applied): the configured 100 from here on; then 100 samples move it
  // half way.
  REQUIRE(s.push(0, 2, 1000, g.data(), 2));
  expect(1 - std::exp2(-10.0), -2, 4);
  REQUIRE(s.push(0, 3, 100, g.data(), 2));
  expect(0.5, -3, 5);
  // A copy stays as it was read while the shard moves on; the parameters are unaveraged.
  auto held = s.average_copy();
  REQUIRE(s.push(0, 4, 100, g.data(), 2));
  CHECK(held[0] == Approx(a0).epsilon(1e-6));
  CHECK(s.params() == std::vector<float>{-4, 6});
  CHECK(s.average_copy()[0] > -4.0f);
}

TEST_CASE("a BSP round moves a shard's running average by the round's samples, and a restore restarts it") {
  auto s = make_shard("bsp", 1);
  s.join(0);
  s.join(1);
  s.keep_average(100);
  std::vector<float> g{2};
  // Round 1, 600 + 400 samples: the half-life is min(100, 1000 / 10) = 100; the
  // parameters go to 0.
  REQUIRE(s.push(0, 0, 600, g.data(), 1));
  CHECK(s.average_copy() == std::vector<float>{1}); // no version yet: unchanged
  REQUIRE(s.push(1, 0, 400, g.data(), 1));
  double a = 1 + (1 - std::exp2(-10.0)) * (0 - 1);
  CHECK(s.average_copy()[0] == Approx(a).margin(1e-6));
  // Round 2, 60 + 40 samples: 1 - 0.5^(100 / 100) = half way toward -1 (counting only
  // one push's samples would move it by 1 - 0.5^0.4 or 1 - 0.5^0.6).
  REQUIRE(s.push(0, 1, 60, g.data(), 1));
  REQUIRE(s.push(1, 1, 40, g.data(), 1));
  a += 0.5 * (-1 - a);
  CHECK(s.average_copy()[0] == Approx(a).epsilon(1e-6));
  REQUIRE_FALSE(s.restore(7, std::vector<float>{5}, {}));
  CHECK(s.average_copy() == std::vector<float>{5});
}

TEST_CASE("a restore with a checkpointed running average goes on from it, counting the samples it had seen, and a "
          "shard that keeps none ignores it") {
  auto s = make_shard("asp", 2);
  s.join(0);
  s.keep_average(100);
  // The checkpointed average had seen 5000 samples: the half-life is the configured 100,
  // not a tenth of the samples since the restore (which would be 10 after 100 samples).
  REQUIRE_FALSE(s.restore(3, std::vector<float>{4, 4}, {}, std::vector<float>{2, 6}, 5000));
  CHECK(s.version() == 3);
  CHECK(s.params() == std::vector<float>{4, 4});
  CHECK(s.average_copy() == std::vector<float>{2, 6});
  CHECK(s.average_samples() == 5000);
  std::vector<float> g{2, -2}; // lr 0.5: the parameters go to (3, 5)
  REQUIRE(s.push(0, 3, 100, g.data(), 2));
  CHECK(s.average_copy()[0] == Approx(2 + 0.5 * (3 - 2)).epsilon(1e-6));
  CHECK(s.average_copy()[1] == Approx(6 + 0.5 * (5 - 6)).epsilon(1e-6));
  CHECK(s.average_samples() == 5100);
  // An average of the wrong size is refused, naming the sizes, and nothing changes.
  auto err = s.restore(9, std::vector<float>{0, 0}, {}, std::vector<float>{1, 2, 3}, 10);
  REQUIRE(err);
  CHECK(is(err, errc::shape_mismatch));
  CHECK(describe(err).find("3 averages for a range of 2") != std::string::npos);
  CHECK(s.version() == 4);
  // A shard that keeps no average takes the parameters and drops the average.
  auto plain = make_shard("asp", 2);
  REQUIRE_FALSE(plain.restore(3, std::vector<float>{4, 4}, {}, std::vector<float>{2, 6}, 5000));
  CHECK_FALSE(plain.keeps_average());
  CHECK(plain.average().empty());
  CHECK(plain.average_copy() == std::vector<float>{4, 4});
}

TEST_CASE("a shard without a running average hands out its parameters as the average") {
  auto s = make_shard("asp", 2);
  s.join(0);
  CHECK_FALSE(s.keeps_average());
  std::vector<float> g{2, -2};
  REQUIRE(s.push(0, 0, 10, g.data(), 2));
  CHECK(s.average_copy() == s.params().to_vector());
  s.keep_average(0);
  CHECK_FALSE(s.keeps_average());
}

TEST_CASE("the shards' Adam and AdamW take torch.optim's steps, each update counted once for its bias correction") {
  // torch.optim.Adam / AdamW (lr 0.1, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01)
  // from [0.5, -1, 2] after the gradients below: as printed by Debian's torch 1.13.
  const std::vector<std::vector<float>> grads{{0.1f, -0.2f, 0.3f}, {0.4f, 0.0f, -0.1f}, {-0.3f, 0.5f, 0.2f}};
  const std::vector<std::pair<update_rule, std::vector<float>>> cases{
    {update_rule::adam, {0.2921967f, -0.8673250f, 1.7879426f}},
    {update_rule::adamw, {0.2926814f, -0.8703648f, 1.7939154f}}};
  for (const auto& [rule, want] : cases) {
    INFO(to_string(rule));
    sgd_config opt;
    opt.lr = 0.1f;
    opt.weight_decay = 0.01f;
    opt.rule = rule;
    // By the function, and by an asp shard whose pushes arrive in two pieces each.
    std::vector<float> w{0.5f, -1.0f, 2.0f}, m(3, 0.0f), v(3, 0.0f);
    uint64_t t = 0;
    for (const auto& g : grads)
      optimizer_apply(opt, 1.0f, w.data(), m.data(), v.data(), g.data(), 3, ++t);
    auto p = make_policy("asp", {});
    REQUIRE(p);
    shard_core s{shard_range{0, 0, 3}, {0.5f, -1.0f, 2.0f}, opt, std::move(*p)};
    s.join(0);
    for (const auto& g : grads) {
      REQUIRE(s.begin_push(0, s.version(), 8, 3));
      REQUIRE(s.push_piece(0, 0, g.data(), 2));
      REQUIRE(s.push_piece(0, 2, g.data() + 2, 1));
    }
    for (size_t i = 0; i < 3; ++i) {
      CHECK(w[i] == Approx(want[i]).epsilon(1e-6));
      CHECK(s.params()[i] == Approx(want[i]).epsilon(1e-6));
    }
  }
}

TEST_CASE("a restored shard under Adam starts its moments and count over, so its next step is a first step's size") {
  sgd_config opt;
  opt.lr = 0.1f;
  opt.weight_decay = 0.0f;
  opt.rule = update_rule::adam;
  auto p = make_policy("asp", {});
  REQUIRE(p);
  shard_core s{shard_range{0, 0, 1}, {0.0f}, opt, std::move(*p)};
  s.join(0);
  float g = 1.0f;
  for (int i = 0; i < 5; ++i)
    REQUIRE(s.push(0, s.version(), 1, &g, 1));
  REQUIRE_FALSE(s.restore(s.version(), {1.0f}, {0.7f}));
  g = 0.01f;
  REQUIRE(s.push(0, s.version(), 1, &g, 1));
  // Adam's first step moves by lr whatever the gradient's size (m / sqrt(v) = sign).
  CHECK(s.params()[0] == Approx(1.0f - 0.1f).epsilon(1e-5));
}
