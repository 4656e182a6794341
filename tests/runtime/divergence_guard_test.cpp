// The divergence guard: when it backs off, when it snapshots, when it gives up.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "runtime/optim/divergence_guard.hpp"

using namespace ashlar;
using act = divergence_guard::action;

TEST_CASE("a loss that is not finite backs off at once, and the lr halves with every back-off") {
  divergence_guard g;
  CHECK(g.observe(2.3, 0.0) == act::none);
  CHECK(g.observe(std::numeric_limits<double>::quiet_NaN(), 0.1) == act::back_off);
  CHECK(g.why() == "the training loss is not finite");
  g.backed_off(0.1);
  CHECK(g.lr_scale() == 0.5);
  // Settling: readings mean nothing for settle_s.
  CHECK(g.observe(INFINITY, 0.5) == act::none);
  CHECK(g.observe(INFINITY, 1.2) == act::back_off);
  g.backed_off(1.2);
  CHECK(g.lr_scale() == 0.25);
  CHECK(g.backoffs() == 2);
}

TEST_CASE("a loss rising far above its start, or losing most of the progress made, backs off after two readings") {
  divergence_guard g;
  g.observe(2.3, 0.0);
  CHECK(g.observe(3.6, 0.1) == act::none); // one reading may be noise
  CHECK(g.observe(3.0, 0.2) == act::none); // back under 1.5x the start
  CHECK(g.observe(3.6, 0.3) == act::none);
  CHECK(g.observe(3.7, 0.4) == act::back_off);
  CHECK(g.why().find("rose to 3.7") != std::string::npos);
  // A resumed job starting at a small loss: its noise is no divergence.
  divergence_guard r;
  r.observe(0.005, 0.0);
  for (int i = 1; i < 10; ++i)
    CHECK(r.observe(i % 2 ? 0.013 : 0.004, 0.1 * i) != act::back_off);
  r.observe(1.2, 1.0);
  CHECK(r.observe(1.3, 1.1) == act::back_off);

  divergence_guard h;
  h.observe(2.3, 0.0);
  for (double t = 0.1, l = 2.2; l > 0.4; t += 0.1, l -= 0.1)
    h.observe(l, t);
  // Best ~0.4: the limit is 0.4 + 0.75 x 1.9, about 1.83; noise below it is fine.
  CHECK(h.observe(0.9, 3.0) != act::back_off);
  CHECK(h.observe(1.2, 3.1) == act::none);
  CHECK(h.observe(2.0, 3.2) == act::none);
  CHECK(h.observe(2.1, 3.3) == act::back_off);
}

TEST_CASE("snapshots are taken every snapshot_every_s while the loss is near its best, never while it is high") {
  divergence_guard g{{2.0, 1.0, 6}};
  g.observe(2.3, 0.0);
  CHECK(g.observe(1.0, 0.5) == act::snapshot);
  g.snapshot_taken(1.0, 0.5);
  CHECK(g.observe(0.9, 1.0) == act::none); // not due yet
  CHECK(g.observe(0.8, 2.6) == act::snapshot);
  g.snapshot_taken(0.8, 2.6);
  CHECK(g.observe(1.9, 5.0) == act::none); // due, but far from the best
}

TEST_CASE("after max_backoffs the guard gives up, with the reason") {
  divergence_guard g{{2.0, 0.0, 2}};
  g.observe(2.3, 0.0);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(g.observe(NAN, 1.0 + i) == act::back_off);
    g.backed_off(1.0 + i);
  }
  CHECK(g.observe(NAN, 5.0) == act::give_up);
  CHECK(g.why() == "the training loss is not finite");
}

TEST_CASE("a loss that never falls below 0.9x its start within the patience counts as divergence") {
  divergence_settings s;
  s.patience_samples = 1000;
  s.start_hint = 2.3026;
  divergence_guard g{s};
  g.observe(2.30, 0.0, 0);
  CHECK(g.observe(2.25, 0.5, 600) != act::back_off);
  CHECK(g.observe(2.31, 1.0, 1100) == act::back_off);
  CHECK(g.why().find("has not fallen below 0.9x an untrained model's 2.3 in 1000 samples") != std::string::npos);
  g.backed_off(1.0);
  // The patience starts over with the back-off; progress ends it.
  CHECK(g.observe(2.30, 2.5, 1500) == act::none);
  CHECK(g.observe(1.50, 3.0, 1900) != act::back_off);
  CHECK(g.observe(1.40, 4.0, 5000) != act::back_off);
}

TEST_CASE("the no-progress rule measures against the lower of the first reading and the untrained model's loss") {
  divergence_settings s;
  s.start_hint = 2.3026;
  s.patience_samples = 1000;
  divergence_guard g{s};
  g.observe(5.5, 0.0, 0); // already diverging at the first reading
  CHECK(g.observe(9.0, 0.1, 100) == act::none);
  CHECK(g.observe(9.5, 0.2, 200) == act::back_off);
  g.backed_off(0.2);
  // Dead at chance after the back-off: no progress from 2.3, so the patience runs out.
  CHECK(g.observe(2.30, 1.5, 800) != act::back_off);
  CHECK(g.observe(2.30, 2.0, 1300) == act::back_off);
}

TEST_CASE("a resumed run starting at a small loss is never held to the patience rule") {
  divergence_settings s;
  s.patience_samples = 1000;
  s.start_hint = 2.3026;
  divergence_guard g{s};
  g.observe(0.04, 0.0, 0);
  for (int i = 1; i < 20; ++i)
    CHECK(g.observe(i % 2 ? 0.09 : 0.04, 0.5 * i, 500u * i) != act::back_off);
}

TEST_CASE("a model whose first loss is above ln classes is judged against its own start") {
  divergence_settings s;
  s.start_hint = 2.3026;
  divergence_guard g{s};
  g.observe(3.65, 0.0, 0);
  CHECK(g.observe(3.7, 0.1, 100) != act::back_off);
  CHECK(g.observe(3.6, 0.2, 200) != act::back_off);
  CHECK(g.observe(2.8, 0.3, 300) != act::back_off);
}

TEST_CASE("a loss that is not finite from some workers while others report one is read as theirs, not the job's") {
  auto r = read_losses({{0, 0.7}, {1, std::nan("")}, {2, 0.9}, {3, INFINITY}});
  CHECK(r.suspects());
  CHECK(r.not_finite == std::vector<uint32_t>{1, 3});
  CHECK(r.finite == 2);
  CHECK(r.others == Approx(0.8));
  auto all = read_losses({{0, std::nan("")}, {1, std::nan("")}});
  CHECK_FALSE(all.suspects()); // every worker: the job diverged
  CHECK(all.not_finite.size() == 2);
  CHECK_FALSE(read_losses({{0, 0.5}}).suspects());
}
