// The policy rules: each policy's values derived from the configuration's, never over a
// key the user set.
#include <catch2/catch.hpp>

#include <utility>

#include "runtime/policy/policy_rules.hpp"

using namespace ashlar;

namespace {

train_config recipe(const std::string& policy, uint32_t workers) {
  train_config c;
  REQUIRE_FALSE(apply_toml_text(c, "[train]\nlr = 0.1\nmomentum = 0.9\nbatch_size = 64\n", "recipe.toml"));
  c.policy = policy;
  c.workers = workers;
  return c;
}

}  // namespace

TEST_CASE("averaged-round policies train on the configuration's own values") {
  for (auto p : {"bsp", "ring"}) {
    auto c = recipe(p, 4);
    CHECK(policy_rule_changes(c).empty());
  }
}

TEST_CASE("k-sync scales the learning rate by k/workers, the share of the recipe's batch a round averages") {
  auto c = recipe("ksync", 4); // k = 0: half the workers
  REQUIRE_FALSE(apply_policy_rules(c));
  CHECK(c.optimizer.lr == Approx(0.05));
  CHECK(c.optimizer.momentum == Approx(0.9));
  CHECK(c.sources.at("train.lr").rfind("rule: train.lr 0.1 x k/W = 2/4 workers", 0) == 0);
  auto five = recipe("ksync", 5); // half of 5, rounded up
  REQUIRE_FALSE(apply_policy_rules(five));
  CHECK(five.optimizer.lr == Approx(0.06));
  auto k1 = recipe("ksync", 8);
  k1.policy_settings.k = 1;
  REQUIRE_FALSE(apply_policy_rules(k1));
  CHECK(k1.optimizer.lr == Approx(0.0125));
  // k = every worker is BSP: the recipe as it is.
  auto all = recipe("ksync", 4);
  all.policy_settings.k = 4;
  CHECK(policy_rule_changes(all).empty());
}

TEST_CASE("asynchronous pushes step at lr x min(1, 2/workers) with momentum lowered by asynchrony's own") {
  auto c = recipe("asp", 4);
  REQUIRE_FALSE(apply_policy_rules(c));
  CHECK(c.optimizer.lr == Approx(0.05));
  CHECK(c.optimizer.momentum == Approx(0.15));
  CHECK(c.sources.at("train.lr").rfind("rule: train.lr 0.1 x min(1, 2/4 workers)", 0) == 0);
  auto eight = recipe("ssp", 8);
  REQUIRE_FALSE(apply_policy_rules(eight));
  CHECK(eight.optimizer.lr == Approx(0.025));
  CHECK(eight.optimizer.momentum == Approx(0.025));
  auto two = recipe("kasync", 2);
  REQUIRE_FALSE(apply_policy_rules(two));
  CHECK(two.optimizer.lr == Approx(0.1));
  CHECK(two.optimizer.momentum == Approx(0.4));
  // Applied once: a second pass changes nothing.
  REQUIRE_FALSE(apply_policy_rules(c));
  CHECK(c.optimizer.lr == Approx(0.05));
}

TEST_CASE("adsp and ashl take plain SGD local steps, and ashl takes a smaller batch, weighs commits 2/workers and holds "
          "communication to 0.1") {
  auto a = recipe("adsp", 4);
  REQUIRE_FALSE(apply_policy_rules(a));
  CHECK(a.optimizer.lr == Approx(0.1 / std::sqrt(0.1)).epsilon(1e-3));
  CHECK(a.optimizer.momentum == 0);
  CHECK(a.commit_scale == 0); // 1/workers
  CHECK(a.local_momentum == 0);
  auto h = recipe("ashl", 4);
  REQUIRE_FALSE(apply_policy_rules(h));
  // Its workers' own momentum 0.5, the step lr x (1 - 0.5) so that its effective length
  // lr / (1 - 0.5) is the half of adsp's the rule gives.
  CHECK(h.local_momentum == Approx(0.5));
  CHECK(h.optimizer.lr == Approx(0.1 / (2 * std::sqrt(0.1)) * 0.5).epsilon(1e-3));
  CHECK(h.optimizer.momentum == 0);
  CHECK(h.commit_scale == Approx(0.5));
  CHECK(h.batch_size == 16);
  CHECK(h.ashl.max_comm_share == Approx(0.1));
  auto notes = rule_notes(h);
  CHECK(notes.size() == 7);
  // A local momentum the user set is kept, and the lr follows it.
  auto own = recipe("ashl", 4);
  REQUIRE_FALSE(apply_setting(own, "train.local_momentum", "0", "--set"));
  REQUIRE_FALSE(apply_policy_rules(own));
  CHECK(own.local_momentum == 0);
  CHECK(own.optimizer.lr == Approx(0.1 / (2 * std::sqrt(0.1))).epsilon(1e-3));
}

TEST_CASE("ashl holds a round of commits to about one recipe batch, so more than 2 workers take smaller batches") {
  // Recipe batch 64: 64 / W to the nearest multiple of 8, between 16 and 32.
  const std::pair<uint32_t, uint32_t> expect[] = {{1, 32}, {2, 32}, {3, 24}, {4, 16}, {5, 16}, {6, 16}, {8, 16},
                                                  {16, 16}};
  for (const auto& [workers, batch] : expect) {
    auto h = recipe("ashl", workers);
    REQUIRE_FALSE(apply_policy_rules(h));
    INFO(workers << " workers");
    CHECK(h.batch_size == batch);
  }
  auto three = recipe("ashl", 3);
  REQUIRE_FALSE(apply_policy_rules(three));
  CHECK(three.sources.at("train.batch_size")
          .rfind("rule: train.batch_size 64 / 3 workers, to the nearest multiple of 8", 0) == 0);
  // A larger recipe batch: 128 / 3 = 42.7 rounds to 40, 128 / 5 = 25.6 to 24, and on 2
  // workers half the batch holds.
  const std::pair<uint32_t, uint32_t> large[] = {{2, 64}, {3, 40}, {4, 32}, {5, 24}, {12, 16}};
  for (const auto& [workers, batch] : large) {
    auto h = recipe("ashl", workers);
    REQUIRE_FALSE(apply_setting(h, "train.batch_size", "128", "recipe.toml:4"));
    REQUIRE_FALSE(apply_policy_rules(h));
    INFO(workers << " workers, recipe batch 128");
    CHECK(h.batch_size == batch);
  }
  // Where the floor of 16 decides, the rule says half the batch: a recipe batch of 24 on 4
  // workers and of 32 on 5.
  const std::pair<uint32_t, const char*> floors[] = {{4, "24"}, {5, "32"}};
  for (const auto& [workers, recipe_batch] : floors) {
    auto floor = recipe("ashl", workers);
    REQUIRE_FALSE(apply_setting(floor, "train.batch_size", recipe_batch, "recipe.toml:4"));
    REQUIRE_FALSE(apply_policy_rules(floor));
    CHECK(floor.batch_size == 16);
    CHECK(floor.sources.at("train.batch_size").find(" / 2, at least 16") != std::string::npos);
  }
  // A small recipe batch is never raised (half of 8 would be held at 16), and a batch the
  // user set stands.
  auto small = recipe("ashl", 8);
  REQUIRE_FALSE(apply_setting(small, "train.batch_size", "8", "recipe.toml:4"));
  REQUIRE_FALSE(apply_policy_rules(small));
  CHECK(small.batch_size == 8);
  CHECK(small.sources.at("train.batch_size") == "recipe.toml:4");
  auto own = recipe("ashl", 8);
  REQUIRE_FALSE(apply_setting(own, "train.batch_size", "64", "--set"));
  REQUIRE_FALSE(apply_policy_rules(own));
  CHECK(own.batch_size == 64);
}

TEST_CASE("ashl's fine stage keeps the learning rate of a recipe with a schedule, and halves a constant one") {
  auto constant = recipe("ashl", 4);
  REQUIRE_FALSE(apply_policy_rules(constant));
  CHECK(constant.ashl.shl_lr_scale == Approx(0.5));
  CHECK(constant.sources.count("ashl.shl_lr_scale") == 0);
  auto cosine = recipe("ashl", 4);
  REQUIRE_FALSE(apply_setting(cosine, "train.lr_schedule", "cosine", "recipe.toml:5"));
  REQUIRE_FALSE(apply_policy_rules(cosine));
  CHECK(cosine.ashl.shl_lr_scale == Approx(1.0));
  CHECK(cosine.sources.at("ashl.shl_lr_scale").find("train.lr_schedule cosine anneals") != std::string::npos);
  // A factor the recipe or the user names is kept.
  auto named = recipe("ashl", 4);
  REQUIRE_FALSE(apply_setting(named, "train.lr_schedule", "step", "recipe.toml:5"));
  REQUIRE_FALSE(apply_setting(named, "ashl.shl_lr_scale", "0.5", "recipe.toml:9"));
  REQUIRE_FALSE(apply_policy_rules(named));
  CHECK(named.ashl.shl_lr_scale == Approx(0.5));
  // adsp has no fine stage: nothing to keep.
  auto adsp = recipe("adsp", 4);
  REQUIRE_FALSE(apply_setting(adsp, "train.lr_schedule", "cosine", "recipe.toml:5"));
  REQUIRE_FALSE(apply_policy_rules(adsp));
  CHECK(adsp.sources.count("ashl.shl_lr_scale") == 0);
}

TEST_CASE("a key set by flag, --set or environment is never changed by a rule, and policy_rules = false turns "
          "them off") {
  auto c = recipe("asp", 4);
  REQUIRE_FALSE(apply_setting(c, "train.lr", "0.02", "--lr"));
  REQUIRE_FALSE(apply_setting(c, "train.momentum", "0.7", "env ASHLAR_TRAIN_MOMENTUM"));
  CHECK(user_set(c, "train.lr"));
  CHECK_FALSE(user_set(c, "train.batch_size"));
  CHECK(policy_rule_changes(c).empty());
  REQUIRE_FALSE(apply_policy_rules(c));
  CHECK(c.optimizer.lr == Approx(0.02));
  CHECK(c.optimizer.momentum == Approx(0.7));
  auto off = recipe("ashl", 4);
  REQUIRE_FALSE(apply_setting(off, "train.policy_rules", "false", "recipe.toml:9"));
  CHECK(policy_rule_changes(off).empty());
  // A file's value is the recipe: the rule derives from it.
  auto file = recipe("asp", 4);
  CHECK(file.sources.at("train.lr") == "recipe.toml:2");
  CHECK_FALSE(user_set(file, "train.lr"));
}

TEST_CASE("adsp and ashl evaluate the shards' running average (half-life 1/16 epoch) unless the recipe or the user "
          "names one; other policies keep none") {
  for (auto p : {"adsp", "ashl"}) {
    auto c = recipe(p, 4);
    REQUIRE_FALSE(apply_policy_rules(c));
    CHECK(c.average_epochs == Approx(0.0625));
    CHECK(c.sources.at("train.average_epochs").find("running average") != std::string::npos);
  }
  for (auto p : {"bsp", "asp", "ksync", "ring"}) {
    auto c = recipe(p, 4);
    REQUIRE_FALSE(apply_policy_rules(c));
    CHECK(c.average_epochs == 0);
  }
  auto off = recipe("ashl", 4);
  REQUIRE_FALSE(apply_setting(off, "train.average_epochs", "0", "recipe.toml:7"));
  REQUIRE_FALSE(apply_policy_rules(off));
  CHECK(off.average_epochs == 0);
  auto mine = recipe("adsp", 4);
  REQUIRE_FALSE(apply_setting(mine, "train.average_epochs", "0.25", "--set"));
  REQUIRE_FALSE(apply_policy_rules(mine));
  CHECK(mine.average_epochs == Approx(0.25));
}

TEST_CASE("a script's optimizer has the shards apply what workers push at a unit rate, under every policy, and the "
          "lockstep keys it needs exact are set over the user's") {
  auto lockstep = recipe("bsp", 4);
  lockstep.optimizer_kind = "script";
  REQUIRE_FALSE(apply_setting(lockstep, "train.lr", "0.3", "--lr")); // the user's: still 1 (the mean gradient needs it)
  REQUIRE_FALSE(apply_setting(lockstep, "train.topk_ratio", "0.01", "--set"));
  REQUIRE_FALSE(apply_policy_rules(lockstep));
  CHECK(lockstep.optimizer.lr == Approx(1.0));
  CHECK(lockstep.optimizer.momentum == Approx(0.0));
  CHECK(lockstep.optimizer.weight_decay == Approx(0.0));
  CHECK(lockstep.topk_ratio == 0.0);
  CHECK_FALSE(lockstep.divergence_guard);
  CHECK_FALSE(lockstep.eval_every_epoch);
  CHECK(lockstep.sources.at("train.lr").find("the round's mean gradient") != std::string::npos);

  auto async = recipe("asp", 4);
  async.optimizer_kind = "script";
  REQUIRE_FALSE(apply_policy_rules(async));
  CHECK(async.optimizer.lr == Approx(0.5)); // each worker's delta x min(1, 2/4)
  CHECK(async.optimizer.momentum == Approx(0.0));

  auto local = recipe("ashl", 4);
  local.optimizer_kind = "script";
  REQUIRE_FALSE(apply_setting(local, "train.lr_schedule", "cosine", "--set"));
  REQUIRE_FALSE(apply_policy_rules(local));
  CHECK(local.optimizer.lr == Approx(1.0)); // local steps are exactly the script's
  CHECK(local.local_momentum == 0.0);
  CHECK(local.ashl.shl_lr_scale == Approx(1.0));
  CHECK(local.lr_schedule == lr_schedule_kind::constant);
  CHECK(local.commit_scale == Approx(0.5));

  // Rules off: the script's needs are not rules of thumb, they still hold.
  auto off = recipe("adsp", 2);
  off.optimizer_kind = "script";
  off.policy_rules = false;
  REQUIRE_FALSE(apply_policy_rules(off));
  CHECK(off.optimizer.lr == Approx(1.0));
}

TEST_CASE("train.optimizer takes sgd, adam, adamw or script and names the others") {
  train_config c;
  for (auto name : {"script", "adam", "adamw", "sgd"}) {
    CHECK_FALSE(apply_setting(c, "train.optimizer", name));
    CHECK_FALSE(validate_job(c));
  }
  REQUIRE_FALSE(apply_setting(c, "train.optimizer", "lamb"));
  auto err = validate_job(c);
  REQUIRE(err);
  CHECK(describe(err).find("train.optimizer 'lamb' is not known (known: sgd, adam, adamw, script)")
        != std::string::npos);
}

TEST_CASE("the shards' Adam starts from torch's rate unless the user set one, and is refused under local steps") {
  auto bsp = recipe("bsp", 4);
  REQUIRE_FALSE(apply_setting(bsp, "train.optimizer", "adamw"));
  REQUIRE_FALSE(apply_policy_rules(bsp));
  CHECK(bsp.optimizer.lr == Approx(0.001));
  CHECK(job_optimizer(bsp).rule == update_rule::adamw);
  auto asp = recipe("asp", 4);
  REQUIRE_FALSE(apply_setting(asp, "train.optimizer", "adam"));
  REQUIRE_FALSE(apply_policy_rules(asp));
  CHECK(asp.optimizer.lr == Approx(0.001 * 0.5)); // the push rule's min(1, 2/W) on Adam's rate
  CHECK(asp.optimizer.momentum == Approx(0.9));   // (no momentum rule: beta1 is Adam's)
  auto mine = recipe("bsp", 4);
  REQUIRE_FALSE(apply_setting(mine, "train.optimizer", "adam"));
  REQUIRE_FALSE(apply_setting(mine, "train.lr", "0.003", "--set"));
  REQUIRE_FALSE(apply_policy_rules(mine));
  CHECK(mine.optimizer.lr == Approx(0.003));
  for (auto p : {"adsp", "ashl"}) {
    auto c = recipe(p, 4);
    REQUIRE_FALSE(apply_setting(c, "train.optimizer", "adam"));
    auto err = validate_job(c);
    REQUIRE(err);
    CHECK(describe(err).find(std::string{"train.optimizer adam under "} + p + ": its local steps") != std::string::npos);
  }
  auto bad = recipe("bsp", 2);
  REQUIRE_FALSE(apply_setting(bad, "train.optimizer", "adam"));
  REQUIRE_FALSE(apply_setting(bad, "train.beta2", "1"));
  auto err = validate(bad);
  REQUIRE(err);
  CHECK(describe(err).find("train.beta1 and train.beta2 must be in [0, 1)") != std::string::npos);
}

TEST_CASE("under train.optimizer = script Ashlar's checkpoints are refused, naming how a script checkpoints itself") {
  train_config c;
  REQUIRE_FALSE(apply_setting(c, "train.optimizer", "script"));
  REQUIRE_FALSE(apply_setting(c, "run.checkpoint_dir", "/tmp/ck"));
  auto err = validate_job(c);
  REQUIRE(err);
  CHECK(describe(err).find("run.checkpoint_dir: under train.optimizer = script") != std::string::npos);
  CHECK(describe(err).find("broadcast_optimizer_state") != std::string::npos);
  REQUIRE_FALSE(apply_setting(c, "run.resume", "true"));
  err = validate_job(c);
  REQUIRE(err);
  CHECK(describe(err).find("run.resume: under train.optimizer = script") != std::string::npos);
  REQUIRE_FALSE(apply_setting(c, "train.optimizer", "sgd"));
  CHECK_FALSE(validate_job(c)); // Ashlar's own update keeps them
}
