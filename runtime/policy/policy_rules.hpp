// Each policy's own learning rate, momentum, batch and commit scaling, derived by stated
// rules from the configuration's values and the number of workers, so that choosing a
// policy is enough for it to train.
//
// train.lr, train.momentum and train.batch_size in a configuration file are the recipe of
// synchronous training (BSP: one step per round over every worker's averaged gradient).
// A policy that applies gradients otherwise adapts them:
//
//   bsp, ring                 averaged rounds: the recipe as it is.
//   ksync                     a round averages k of the W workers' gradients, k/W of the
//                               recipe's batch: lr x k/W (the linear scaling rule, Goyal
//                               et al. 2017); without it the noisier rounds of a
//                               heterogeneous cluster keep k-sync below the accuracy
//                               BSP reaches.
//   asp, ssp, kasync,         every push is a step of one worker's gradient:
//   adaptive                    lr x min(1, 2 / workers) (W pushes per round of W workers
//                               would move the model W times as far as one averaged
//                               step; half of that is left, as staler gradients step
//                               on each other less than they add up);
//                               momentum - (1 - 1 / workers), at least 0 (asynchrony of W
//                               workers acts as momentum of about 1 - 1/W: Mitliagkas et
//                               al., "Asynchrony begets momentum", 2016).
//   adsp                      local steps, commits averaged over the workers (commit_scale
//                               0 = 1/W): plain SGD steps (momentum 0, as momentum on the
//                               shards would act across different workers' commits) at
//                               lr / sqrt(1 - momentum), between the recipe's step and its
//                               momentum's effective step lr / (1 - momentum).
//   ashl                      as adsp, with local steps half as long and commits twice as
//                               heavy: lr / (2 sqrt(1 - momentum)), commit_scale
//                               min(1, 2 / workers); batch / 2 (at least 16), so the
//                               slowest worker commits as often with half the batch, and
//                               with more than 2 workers (at the start) batch / workers
//                               to the nearest multiple of 8, at least 16: a round of
//                               commits moves the shards about as far whatever its
//                               batches, so it is held to about one recipe batch (16
//                               from 4 workers at batch 64); and
//                               communication held to 0.1 of the slowest worker's commit
//                               period (ashl.max_comm_share): more local steps per commit.
//
// A key set on the command line (a flag, --set) or in the environment is the user's and
// never changed; train.policy_rules = false turns every rule off. Each policy's row in the
// registry (registry.cpp) names its family (policy_traits::rules) and its own rules, if
// any (ashl's, in ashl.cpp): no rule here names a policy.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/config/train_config.hpp"
#include "runtime/policy/job_planner.hpp"

namespace ashlar {

/// One value a rule derives.
struct rule_change {
  std::string key;   // e.g. "train.lr"
  std::string value; // its text form, e.g. "0.05"
  std::string why;   // e.g. "train.lr 0.1 x 2/4 workers: each asp push is one worker's step"
};

/// Where a rule writes: a change of one key unless the user set it (`required`: whenever
/// its value differs, for keys a script's optimizer needs exact).
struct rule_writer {
  const train_config& cfg;
  std::vector<rule_change>& out;
  double workers = 1;  ///< max(1, train.workers)
  double lr = 0;       ///< the rate the rules start from: the recipe's, or torch's Adam default
  std::string from;    ///< "torch's Adam default " when `lr` is that, else ""
  void change(const std::string& key, const std::string& value, const std::string& why, bool required = false);
  /// "4 workers"
  std::string workers_text() const;
};

/// A number as the rules write it ("%.4g").
std::string rule_number(double v);

/// The configuration's checks (validate), then the policy's: its name is known (with a
/// suggestion), its settings hold (ashl.*), and nothing it cannot take (pulls compressed
/// where the workers hold the model; the shards' Adam under local-step commits).
[[nodiscard]] caf::error validate_job(const train_config& cfg);

/// What the rules of `cfg.policy` would change in `cfg` (keys the user set are left out;
/// nothing when cfg.policy_rules is false).
std::vector<rule_change> policy_rule_changes(const train_config& cfg);

/// Applies policy_rule_changes(cfg) and records each in cfg.sources ("rule: WHY").
[[nodiscard]] caf::error apply_policy_rules(train_config& cfg);

/// Whether the value of `key` in `cfg` was set by the user (flag, --set, environment),
/// not by a default, a configuration file or a rule.
bool user_set(const train_config& cfg, const std::string& key);

/// One line per rule applied: "lr 0.05 (train.lr 0.1 x 2/4 workers: ...)".
std::vector<std::string> rule_notes(const train_config& cfg);

}  // namespace ashlar
