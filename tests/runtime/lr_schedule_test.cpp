#include <catch2/catch.hpp>

#include "runtime/config/train_config.hpp"
#include "runtime/optim/lr_schedule.hpp"
#include "runtime/server/shard_core.hpp"

using namespace ashlar;

TEST_CASE("learning-rate schedules: constant stays 1, cosine falls from 1 to 0, step drops tenfold twice") {
  lr_schedule c;
  CHECK(lr_factor(c, 0, 10) == 1.0);
  CHECK(lr_factor(c, 9.9, 10) == 1.0);
  lr_schedule cos{lr_schedule::cosine};
  CHECK(lr_factor(cos, 0, 10) == Approx(1.0));
  CHECK(lr_factor(cos, 5, 10) == Approx(0.5));
  CHECK(lr_factor(cos, 2.5, 10) == Approx(0.5 * (1 + std::sqrt(0.5))));
  CHECK(lr_factor(cos, 10, 10) == Approx(0.0).margin(1e-12));
  CHECK(lr_factor(cos, 12, 10) == Approx(0.0).margin(1e-12)); // past the end: where it ended
  for (double e = 0; e < 10; e += 0.5)
    CHECK(lr_factor(cos, e + 0.5, 10) < lr_factor(cos, e, 10));
  lr_schedule st{lr_schedule::step};
  CHECK(lr_factor(st, 4.99, 10) == 1.0);
  CHECK(lr_factor(st, 5, 10) == Approx(0.1));
  CHECK(lr_factor(st, 7.5, 10) == Approx(0.01));
}

TEST_CASE("warmup ramps the learning rate linearly over its epochs, then the schedule takes over") {
  lr_schedule s{lr_schedule::cosine, 2.0};
  CHECK(lr_factor(s, 0, 10) == Approx(0.01)); // floored, never 0
  CHECK(lr_factor(s, 1, 10) == Approx(0.5 * lr_factor({lr_schedule::cosine}, 1, 10)));
  CHECK(lr_factor(s, 2, 10) == Approx(lr_factor({lr_schedule::cosine}, 2, 10)));
  lr_schedule flat{lr_schedule::constant, 1.0};
  CHECK(lr_factor(flat, 0.25, 5) == Approx(0.25));
  CHECK(lr_factor(flat, 1.5, 5) == 1.0);
  // A run shorter than twice the warmup warms up over its first half.
  CHECK(lr_factor(flat, 0.25, 1) == Approx(0.5));
  CHECK(lr_factor(flat, 0.5, 1) == 1.0);
}

TEST_CASE("train.lr_schedule and train.warmup_epochs are checked when the config loads") {
  train_config cfg;
  REQUIRE_FALSE(apply_setting(cfg, "train.lr_schedule", "cosine"));
  REQUIRE_FALSE(validate(cfg));
  auto err = apply_setting(cfg, "train.lr_schedule", "linear"); // a mode: refused as it is parsed
  REQUIRE(err);
  CHECK(cfg.lr_schedule == lr_schedule::cosine); // left as it was
  CHECK(describe(err).find("train.lr_schedule: unknown schedule 'linear' (choices: constant, cosine, step)")
        != std::string::npos);
  cfg = train_config{};
  REQUIRE_FALSE(validate(cfg));
  REQUIRE_FALSE(apply_setting(cfg, "train.warmup_epochs", "-1"));
  err = validate(cfg);
  REQUIRE(err);
  CHECK(describe(err).find("train.warmup_epochs") != std::string::npos);
}

TEST_CASE("a shard's updates scale by the schedule's factor on top of its stage's") {
  sgd_config opt;
  opt.lr = 0.5f;
  opt.momentum = 0.0f;
  opt.weight_decay = 0.0f;
  auto p = make_policy("asp", {});
  REQUIRE(p);
  shard_core s{shard_range{0, 0, 1}, std::vector<float>(1, 1.0f), opt, std::move(*p)};
  s.join(0);
  const float g = 1.0f;
  REQUIRE(s.push(0, 0, 8, &g, 1));
  CHECK(s.params()[0] == Approx(0.5f));
  s.set_schedule_scale(0.5f);
  REQUIRE(s.push(0, 1, 8, &g, 1));
  CHECK(s.params()[0] == Approx(0.25f));
  s.set_lr_scale(0.5f);
  REQUIRE(s.push(0, 2, 8, &g, 1));
  CHECK(s.params()[0] == Approx(0.125f));
  CHECK(s.lr_scale() == Approx(0.25f));
}

TEST_CASE("with a time limit, the schedule runs on the epochs or the time, whichever is further") {
  CHECK(schedule_epoch(2.0, 10, 30, 0) == 2.0);   // no limit: the epochs
  CHECK(schedule_epoch(2.0, 10, 30, 60) == 5.0);  // half the time: half the epochs
  CHECK(schedule_epoch(8.0, 10, 30, 60) == 8.0);  // the epochs are further
  CHECK(lr_factor({lr_schedule::cosine}, schedule_epoch(0.5, 10, 60, 60), 10) == Approx(0.0).margin(1e-12));
}
