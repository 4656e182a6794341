#include "runtime/policy/policy_rules.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/core/number_text.hpp"
#include "runtime/core/suggest.hpp"
#include "runtime/policy/ashl.hpp"
#include "runtime/policy/sync_policy.hpp"
#include "runtime/policy/k_sync.hpp"

namespace ashlar {

namespace {

std::string num(double v) { return rule_number(v); }

// train.optimizer = script: the workers' scripts step their own optimizers; the shards
// carry what those need, at a unit rate. Keys a lockstep job needs exact are set whether
// or not the user set them (the mean gradient would be wrong otherwise).
void script_rules(rule_writer& w, const policy_traits& t) {
  const auto& cfg = w.cfg;
  const std::string ws = w.workers_text();
  const std::string unit = "train.optimizer script: the script's optimizer sets the step, the shards apply ";
  const std::string own = "train.optimizer script: ";
  switch (t.rules) {
    case rule_family::averaged:
      w.change("train.lr", "1", unit + "what the workers push at a unit rate and hold the round's mean gradient", true);
      break;
    case rule_family::k_of_w: {
      const auto k = effective_k(cfg.policy_settings.k, static_cast<size_t>(w.workers));
      w.change("train.lr", num(static_cast<double>(k) / w.workers),
               unit + "a round's mean parameter delta times k/W = " + std::to_string(k) + "/" + ws);
      break;
    }
    case rule_family::async_push:
      w.change("train.lr", num(std::min(1.0, 2.0 / w.workers)),
               unit + "each worker's parameter delta times min(1, 2/" + ws + ") (W deltas a round would move the "
                      "model W times one worker's step)");
      break;
    case rule_family::local_steps:
      w.change("train.lr", "1", unit + "commits of parameter deltas as they come; each worker's local steps are its "
                                 "script's optimizer steps, exactly", true);
      break;
  }
  w.change("train.momentum", "0", own + "the shards keep no momentum (the script's optimizer has its state)", true);
  w.change("train.weight_decay", "0", own + "the shards apply no decay (the script's optimizer has its own)", true);
  w.change("train.lr_schedule", "constant",
           own + "the shards follow no schedule (the script's LR scheduler is the schedule)", true);
  w.change("train.warmup_epochs", "0", own + "the shards follow no warmup", true);
  w.change("train.local_momentum", "0", own + "local steps are the script's optimizer steps, exactly", true);
  w.change("ashl.shl_lr_scale", "1", own + "SHL does not scale the script's steps", true);
  w.change("run.divergence_guard", "false",
           "train.optimizer script: backing off the shards' rate would scale the script's steps; the script watches "
           "its loss",
           true);
  w.change("run.eval_every_epoch", "false", "train.optimizer script: the script evaluates its model itself");
  // The job's own data only paces and counts the steps' sizes: a small synthetic set, not
  // a data set every worker process would hold.
  const uint64_t token = std::max<uint64_t>(1024, uint64_t{4} * cfg.batch_size * std::max(cfg.workers, cfg.max_workers));
  w.change("data.source", "synthetic", own + "the scripts bring their data; the job's is a token set");
  w.change("data.train_limit", std::to_string(token), own + "the token set's samples: 4 batches a worker, at least 1024");
  w.change("data.test_limit", "16", own + "the scripts evaluate their model");
  if (t.rules == rule_family::averaged)
    w.change("train.topk_ratio", "0", "train.optimizer script under " + cfg.policy + ": the round's mean gradient is exact",
             true);
  if (t.own_script_rules)
    t.own_script_rules(w);
}

// The rules of a policy of the recipe's own optimizer (SGD, or the shards' Adam).
void recipe_rules(rule_writer& w, const policy_traits& t, bool adam, bool adam_rate) {
  const auto& cfg = w.cfg;
  const double mu = cfg.optimizer.momentum;
  const std::string ws = w.workers_text();
  const double lr = w.lr;
  const auto k = effective_k(cfg.policy_settings.k, static_cast<size_t>(w.workers));
  const bool full_rounds = t.rules == rule_family::averaged || (t.rules == rule_family::k_of_w && k >= w.workers);
  if (adam_rate && full_rounds)
    w.change("train.lr", num(lr), "train.optimizer " + cfg.optimizer_kind
                                    + ": torch's default Adam rate (the recipe's train.lr is its SGD's)");
  switch (t.rules) {
    case rule_family::averaged:
      break;
    case rule_family::k_of_w:
      if (k < w.workers)
        w.change("train.lr", num(lr * k / w.workers),
                 w.from + "train.lr " + num(lr) + " x k/W = " + std::to_string(k) + "/" + ws
                   + ": a round averages k of the W gradients the recipe's batch has (linear scaling)");
      break;
    case rule_family::async_push: {
      const double f = std::min(1.0, 2.0 / w.workers);
      w.change("train.lr", num(lr * f),
               w.from + "train.lr " + num(lr) + " x min(1, 2/" + ws + "): every " + cfg.policy
                 + " push is a step of one worker's gradient");
      const double implicit = 1.0 - 1.0 / w.workers;
      if (!adam) // (Adam's first moment is beta1's, not train.momentum)
        w.change("train.momentum", num(std::max(0.0, mu - implicit)),
                 "train.momentum " + num(mu) + " - (1 - 1/" + ws + "), at least 0: asynchrony acts as momentum "
                   + num(implicit));
      break;
    }
    case rule_family::local_steps: {
      if (t.own_rules) {
        t.own_rules(w);
      } else {
        const double keep = std::sqrt(std::max(1e-6, 1.0 - mu));
        w.change("train.lr", num(lr / keep),
                 "train.lr " + num(lr) + " / sqrt(1 - momentum " + num(mu) + "): plain SGD local steps, between the "
                   "recipe's step and its momentum's effective step");
      }
      w.change("train.momentum", "0", "momentum on the shards would act across different workers' commits");
      if (cfg.sources.count("train.average_epochs") == 0) // the recipe's or the user's own value stands
        w.change("train.average_epochs", "0.0625",
                 "commits of many local steps leave the shards' parameters noisy: evaluations and the final accuracy "
                 "read their running average, half-life 1/16 epoch");
      break;
    }
  }
}

}  // namespace

std::string rule_number(double v) { return number_text("%.4g", v); }

void rule_writer::change(const std::string& key, const std::string& value, const std::string& why, bool required) {
  if ((required || !user_set(cfg, key)) && setting_text(cfg, key) != value)
    out.push_back({key, value, why});
}

std::string rule_writer::workers_text() const { return num(workers) + " workers"; }

caf::error validate_job(const train_config& c) {
  if (auto err = validate(c))
    return err;
  auto bad = [](const std::string& msg) { return make_error(errc::invalid_config, msg); };
  auto names = policy_names();
  if (std::find(names.begin(), names.end(), c.policy) == names.end()) {
    std::string known;
    for (const auto& n : names)
      known += (known.empty() ? "" : ", ") + n;
    return bad("train.policy '" + c.policy + "' is not known" + did_you_mean(c.policy, names) + " (known: " + known
               + ")");
  }
  if (auto p = ashl_planner::make(c.ashl); !p)
    return p.error();
  const auto t = traits_of(c.policy);
  if (c.pull_topk_ratio > 0 && t.ring)
    return bad("train.pull_topk_ratio: " + c.policy + " jobs have no pulls (the workers hold the model)");
  update_rule rule{};
  if (t.commits && parse_update_rule(c.optimizer_kind, rule) && rule != update_rule::sgd) {
    std::string others;
    for (const auto& n : names)
      if (!traits_of(n).commits)
        others += (others.empty() ? "" : ", ") + n;
    return bad("train.optimizer " + c.optimizer_kind + " under " + c.policy
               + ": its local steps are the workers' SGD (train.local_momentum) and its commits deltas of them; the "
                 "shards' Adam runs under " + others + " (a script's own Adam runs under every policy: "
                 "train.optimizer = script)");
  }
  return caf::none;
}

bool user_set(const train_config& cfg, const std::string& key) {
  auto it = cfg.sources.find(key);
  if (it == cfg.sources.end())
    return false;
  const auto& s = it->second;
  return s.rfind("env ", 0) == 0 || s.rfind("--", 0) == 0;
}

std::vector<rule_change> policy_rule_changes(const train_config& cfg) {
  std::vector<rule_change> out;
  const auto t = traits_of(cfg.policy);
  rule_writer w{cfg, out, static_cast<double>(std::max<uint32_t>(cfg.workers, 1))};
  if (script_optimizer(cfg)) {
    script_rules(w, t); // what the shards must do for the script's optimizer, rules on or off
    return out;
  }
  if (!cfg.policy_rules)
    return out;
  const bool adam = job_optimizer(cfg).rule != update_rule::sgd;
  // Adam's rate is no SGD rate: a recipe's train.lr is for its SGD, so Adam starts from
  // torch's default unless the user set one; the policies' factors apply to it as to SGD's.
  const bool adam_rate = adam && !user_set(cfg, "train.lr");
  w.lr = adam_rate ? 0.001 : cfg.optimizer.lr;
  w.from = adam_rate ? "torch's Adam default " : "";
  recipe_rules(w, t, adam, adam_rate);
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
