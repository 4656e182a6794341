#include "runtime/config/policy_rules.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/core/number_text.hpp"
#include "runtime/policy/k_sync.hpp"

namespace ashlar {

namespace {

std::string num(double v) { return number_text("%.4g", v); }

bool is_async_push(const std::string& p) {
  return p == "asp" || p == "ssp" || p == "kasync" || p == "adaptive";
}

// train.optimizer = script: the workers' scripts step their own optimizers; the shards
// carry what those need, at a unit rate. Keys a lockstep job needs exact are set whether
// or not the user set them (the mean gradient would be wrong otherwise).
std::vector<rule_change> script_rule_changes(const train_config& cfg) {
  std::vector<rule_change> out;
  const double w = std::max<uint32_t>(cfg.workers, 1);
  const auto& p = cfg.policy;
  const bool lockstep = p == "bsp" || p == "ring";
  const std::string ws = num(w) + " workers";
  auto change = [&](const std::string& key, const std::string& value, const std::string& why, bool required) {
    if ((required || !user_set(cfg, key)) && setting_text(cfg, key) != value)
      out.push_back({key, value, why});
  };
  const std::string unit = "train.optimizer script: the script's optimizer sets the step, the shards apply ";
  const std::string own = "train.optimizer script: ";
  if (lockstep) {
    change("train.lr", "1", unit + "what the workers push at a unit rate and hold the round's mean gradient", true);
  } else if (p == "ksync") {
    const auto k = effective_k(cfg.policy_settings.k, static_cast<size_t>(w));
    change("train.lr", num(static_cast<double>(k) / w),
           unit + "a round's mean parameter delta times k/W = " + std::to_string(k) + "/" + ws, false);
  } else if (is_async_push(p)) {
    change("train.lr", num(std::min(1.0, 2.0 / w)),
           unit + "each worker's parameter delta times min(1, 2/" + ws + ") (W deltas a round would move the model "
                  "W times one worker's step)", false);
  } else {
    change("train.lr", "1", unit + "commits of parameter deltas as they come; each worker's local steps are its "
                               "script's optimizer steps, exactly", true);
  }
  change("train.momentum", "0", own + "the shards keep no momentum (the script's optimizer has its state)", true);
  change("train.weight_decay", "0", own + "the shards apply no decay (the script's optimizer has its own)", true);
  change("train.lr_schedule", "constant", own + "the shards follow no schedule (the script's LR scheduler is the schedule)",
         true);
  change("train.warmup_epochs", "0", own + "the shards follow no warmup", true);
  change("train.local_momentum", "0", own + "local steps are the script's optimizer steps, exactly", true);
  change("ashl.shl_lr_scale", "1", own + "SHL does not scale the script's steps", true);
  change("run.divergence_guard", "false",
         "train.optimizer script: backing off the shards' rate would scale the script's steps; the script watches its loss",
         true);
  change("run.eval_every_epoch", "false", "train.optimizer script: the script evaluates its model itself", false);
  // The job's own data only paces and counts the steps' sizes: a small synthetic set, not
  // a data set every worker process would hold.
  const uint64_t token = std::max<uint64_t>(1024, uint64_t{4} * cfg.batch_size * std::max(cfg.workers, cfg.max_workers));
  change("data.source", "synthetic", own + "the scripts bring their data; the job's is a token set", false);
  change("data.train_limit", std::to_string(token), own + "the token set's samples: 4 batches a worker, at least 1024",
         false);
  change("data.test_limit", "16", own + "the scripts evaluate their model", false);
  if (lockstep)
    change("train.topk_ratio", "0", "train.optimizer script under " + p + ": the round's mean gradient is exact", true);
  if (p == "ashl") {
    // Adam-like steps are of about one size in every entry: top-k keeps little of a delta
    // (ops/bench/hvd_hetero.py, AdamW at 1,1,2,4: best accuracy 0.869 with ashl's 10%
    // pushes and pulls, 0.874-0.876 dense, on one host).
    change("ashl.topk_ratio", "0", own + "dense commits: the script's optimizer's deltas do not sparsify as gradients do",
           false);
    change("ashl.pull_topk_ratio", "0", own + "dense pulls, as the commits", false);
  }
  if (p == "ashl" && cfg.commit_scale == 0)
    change("train.commit_scale", num(std::min(1.0, 2.0 / w)),
           "min(1, 2/" + ws + "): as ashl's commits of gradients, twice an average's share", false);
  return out;
}

}  // namespace

bool user_set(const train_config& cfg, const std::string& key) {
  auto it = cfg.sources.find(key);
  if (it == cfg.sources.end())
    return false;
  const auto& s = it->second;
  return s.rfind("env ", 0) == 0 || s.rfind("--", 0) == 0;
}

std::vector<rule_change> policy_rule_changes(const train_config& cfg) {
  std::vector<rule_change> out;
  if (script_optimizer(cfg))
    return script_rule_changes(cfg); // what the shards must do for the script's optimizer, rules on or off
  if (!cfg.policy_rules)
    return out;
  const double w = std::max<uint32_t>(cfg.workers, 1);
  const bool adam = job_optimizer(cfg).rule != update_rule::sgd;
  // Adam's rate is no SGD rate: a recipe's train.lr is for its SGD, so Adam starts from
  // torch's default unless the user set one; the policies' factors apply to it as to SGD's.
  const bool adam_rate = adam && !user_set(cfg, "train.lr");
  const double lr = adam_rate ? 0.001 : cfg.optimizer.lr;
  const double mu = cfg.optimizer.momentum;
  const auto& p = cfg.policy;
  const std::string ws = num(w) + " workers";
  auto change = [&](const std::string& key, const std::string& value, const std::string& why) {
    if (!user_set(cfg, key) && setting_text(cfg, key) != value)
      out.push_back({key, value, why});
  };
  if (adam_rate && (p == "bsp" || p == "ring" || (p == "ksync" && effective_k(cfg.policy_settings.k,
                                                                                 static_cast<size_t>(w)) >= w)))
    change("train.lr", num(lr), "train.optimizer " + cfg.optimizer_kind
                                  + ": torch's default Adam rate (the recipe's train.lr is its SGD's)");
  const std::string from = adam_rate ? "torch's Adam default " : "";
  if (p == "ksync") {
    const auto k = effective_k(cfg.policy_settings.k, static_cast<size_t>(w));
    if (k < w)
      change("train.lr", num(lr * k / w),
             from + "train.lr " + num(lr) + " x k/W = " + std::to_string(k) + "/" + ws
               + ": a round averages k of the W gradients the recipe's batch has (linear scaling)");
  } else if (is_async_push(p)) {
    const double f = std::min(1.0, 2.0 / w);
    change("train.lr", num(lr * f),
           from + "train.lr " + num(lr) + " x min(1, 2/" + ws + "): every " + p
             + " push is a step of one worker's gradient");
    const double implicit = 1.0 - 1.0 / w;
    if (!adam) // (Adam's first moment is beta1's, not train.momentum)
      change("train.momentum", num(std::max(0.0, mu - implicit)),
           "train.momentum " + num(mu) + " - (1 - 1/" + ws + "), at least 0: asynchrony acts as momentum "
             + num(implicit));
  } else if (p == "adsp" || p == "ashl") {
    const double keep = std::sqrt(std::max(1e-6, 1.0 - mu));
    if (p == "adsp") {
      change("train.lr", num(lr / keep),
             "train.lr " + num(lr) + " / sqrt(1 - momentum " + num(mu) + "): plain SGD local steps, between the "
               "recipe's step and its momentum's effective step");
    } else {
      // Each worker's own momentum (Polyak's, over its gradients only): with it, one
      // process needs fewer samples to a level (ops/bench/sequential_sgd.py); the step's
      // effective length lr / (1 - local momentum) stays the rule's.
      const double lm = user_set(cfg, "train.local_momentum") ? cfg.local_momentum : 0.5;
      change("train.local_momentum", num(lm),
             "each worker's momentum over its own gradients, in its local steps and commits");
      change("train.lr", num(lr / (2 * keep) * (1 - lm)),
             "train.lr " + num(lr) + " / (2 sqrt(1 - momentum " + num(mu) + ")) x (1 - local momentum " + num(lm)
               + "): local steps half as long as adsp's, their velocity's included");
      if (cfg.commit_scale == 0)
        change("train.commit_scale", num(std::min(1.0, 2.0 / w)),
               "min(1, 2/" + ws + "): commits twice as heavy as an average's share, to match the shorter local "
                                  "steps");
      // At most half the recipe's batch (the slowest worker commits as often with more,
      // smaller local steps), and with more than 2 workers less: a round of commits (one
      // from every worker) moves the shards by about the same whatever its batches, so at
      // a fixed batch each more worker adds samples to a round and not progress. The round
      // (of the workers at the start) is held to about one recipe batch: batch / workers
      // to the nearest multiple of 8, at least 16 (from 4 workers at batch 64). Trials at
      // batch 64, three runs each (`ashlar bench hetero --profile random`): the CNN on 4 and
      // 5 workers reached 90% after 89-95 s at 16 against 95-105 s at 32 and 24, the MLP on
      // 4 workers 85% after 2.8 s against 3.0 s, on another machine 3.5 s against 2.9 s (its
      // 0.5 ms per sample loses rate at small batches on 2 cores); on 3 workers 24 took
      // 2.5-2.8 s, 32 2.6-3.0 s and 16 3.0 s.
      const uint32_t half = std::max<uint32_t>(16, cfg.batch_size / 2);
      const double round_share = static_cast<double>(cfg.batch_size) / w;
      const uint32_t by_round = std::max<uint32_t>(16, static_cast<uint32_t>(std::lround(round_share / 8)) * 8);
      const uint32_t batch = std::min(half, by_round);
      if (batch < cfg.batch_size)
        change("train.batch_size", std::to_string(batch),
               by_round >= half
                 ? "train.batch_size " + std::to_string(cfg.batch_size)
                     + " / 2, at least 16: the slowest worker commits as often with more, smaller local steps"
                 : "train.batch_size " + std::to_string(cfg.batch_size) + " / " + ws
                     + ", to the nearest multiple of 8, at least 16: a round of commits moves the shards as far "
                       "whatever its batches, so it is held to about one recipe batch");
      // A recipe with a schedule has its own plan for the learning rate's decay; SHL's
      // factor on top of it cut the CNN's steps short where samples, not noise, set the
      // time to 90% (three seeds each: 135 s at 0.5, 115 s at 1, 195 s at 0.25).
      if (cfg.lr_schedule != lr_schedule_kind::constant && cfg.sources.count("ashl.shl_lr_scale") == 0)
        change("ashl.shl_lr_scale", "1",
               "train.lr_schedule " + setting_text(cfg, "train.lr_schedule")
                 + " anneals the learning rate: SHL does not scale it again");
      if (cfg.ashl.max_comm_share > 0.1)
        change("ashl.max_comm_share", "0.1",
               "communication held to 0.1 of the slowest worker's commit period: more local steps per commit");
    }
    change("train.momentum", "0", "momentum on the shards would act across different workers' commits");
    if (cfg.sources.count("train.average_epochs") == 0) // the recipe's or the user's own value stands
      change("train.average_epochs", "0.0625",
             "commits of many local steps leave the shards' parameters noisy: evaluations and the final accuracy read "
             "their running average, half-life 1/16 epoch");
  }
  return out;
}

caf::error apply_policy_rules(train_config& cfg) {
  // Once: the rules read the recipe, which a second pass would no longer see.
  for (const auto& [key, source] : cfg.sources)
    if (source.rfind("rule: ", 0) == 0)
      return caf::none;
  // The lr and momentum rules read the recipe's values: compute every change first.
  for (const auto& c : policy_rule_changes(cfg))
    if (auto err = apply_setting(cfg, c.key, c.value, "rule: " + c.why))
      return err;
  return caf::none;
}

std::vector<std::string> rule_notes(const train_config& cfg) {
  std::vector<std::string> out;
  for (const auto& [key, source] : cfg.sources)
    if (source.rfind("rule: ", 0) == 0)
      out.push_back(key + " " + setting_text(cfg, key) + " (" + source.substr(6) + ")");
  return out;
}

}  // namespace ashlar
