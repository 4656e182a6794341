#include "runtime/policy/ashl.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/fmt/fmt.h>

#include "runtime/config/train_config.hpp"
#include "runtime/policy/policy_rules.hpp"
#include "runtime/core/number_text.hpp"

namespace ashlar {

namespace {

std::string fixed(double x) { return number_text("%.1f", x); }  // "3.3"
std::string fixed3(double x) { return number_text("%.3f", x); } // "0.497"

}  // namespace

const char* to_string(ashl_stage s) {
  switch (s) {
    case ashl_stage::profiling:
      return "profiling";
    case ashl_stage::ahl:
      return "ahl";
    case ashl_stage::shl:
      return "shl";
  }
  return "unknown";
}


expected<ashl_planner> ashl_planner::make(ashl_config cfg, uint64_t epoch_samples) {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_config, "ashl." + what); };
  if (cfg.ahl_local_steps == 0 || cfg.shl_local_steps == 0)
    return bad("ahl_local_steps and shl_local_steps must be at least 1");
  if (cfg.max_local_steps < std::max(cfg.ahl_local_steps, cfg.shl_local_steps))
    return bad("max_local_steps (" + std::to_string(cfg.max_local_steps)
               + ") is below a stage's local steps");
  if (!(cfg.plateau_window_s >= 0) || !(cfg.plateau_drop >= 0 && cfg.plateau_drop < 1))
    return bad("plateau_window_s must be >= 0 and plateau_drop in [0, 1)");
  if (!(cfg.plateau_window_epochs > 0) || !std::isfinite(cfg.plateau_window_epochs))
    return bad("plateau_window_epochs must be above 0");
  if (!(cfg.shl_lr_scale > 0 && cfg.shl_lr_scale <= 1))
    return bad("shl_lr_scale must be in (0, 1]");
  if (!(cfg.pull_topk_ratio >= 0 && cfg.pull_topk_ratio < 0.5))
    return bad("pull_topk_ratio must be in [0, 0.5): from 0.5 on a delta read is no smaller than a dense one");
  if (!(cfg.max_comm_share > 0 && cfg.max_comm_share <= 1))
    return bad("max_comm_share must be in (0, 1]");
  if (!(cfg.pull_compress_above >= 0))
    return bad("pull_compress_above must be >= 0");
  return ashl_planner{std::move(cfg), std::max<uint64_t>(1, epoch_samples)};
}

std::optional<ashl_event> ashl_planner::observe(double t_s, double loss, const std::vector<ashl_worker>& live,
                                                uint64_t samples) {
  std::optional<ashl_event> change;
  if (stage_ == ashl_stage::profiling) {
    bool profiled = !live.empty();
    for (const auto& w : live)
      profiled = profiled && w.steps >= cfg_.profile_steps && w.step_s > 0;
    if (profiled) {
      // Does compressing pulls pay? Communication per commit (every step commits while
      // profiling), on average over the workers, against the slowest one's compute.
      double comm = 0, slowest = 0;
      for (const auto& w : live) {
        comm += w.comm_s / static_cast<double>(live.size());
        slowest = std::max(slowest, w.step_s);
      }
      const double share = slowest > 0 ? comm / slowest : 0;
      std::string pulls;
      if (cfg_.pull_topk_ratio > 0 && share >= cfg_.pull_compress_above) {
        pull_ratio_ = static_cast<float>(cfg_.pull_topk_ratio);
        pulls = "; pulls are delta reads of " + fixed(100 * cfg_.pull_topk_ratio) + "% (communication "
                + fixed(1e3 * comm) + " ms per commit, " + fixed3(share) + " of the slowest step's compute)";
      } else {
        pulls = "; pulls stay dense (communication " + fixed(1e3 * comm) + " ms per commit, " + fixed3(share)
                + " of the slowest step's compute)";
      }
      change = ashl_event{t_s, resume_stage_ == ashl_stage::shl ? ashl_stage::shl : ashl_stage::ahl,
                          "every worker profiled over " + std::to_string(cfg_.profile_steps) + " steps"
                            + (resume_stage_ == ashl_stage::shl ? std::string{"; resumed in SHL"} : std::string{})
                            + pulls};
    }
  } else if (stage_ == ashl_stage::ahl && std::isfinite(loss)) {
    losses_.push_back({t_s, samples, loss});
    if (cfg_.rule == ashl_rule::loss) {
      if (loss <= cfg_.switch_loss)
        change = ashl_event{t_s, ashl_stage::shl,
                            "training loss " + fixed3(loss) + " <= " + fixed3(cfg_.switch_loss)};
    } else {
      // The loss a window ago: the latest observation at least a window old, in seconds
      // or in samples trained.
      const bool seconds = cfg_.plateau_window_s > 0;
      const double window_samples = cfg_.plateau_window_epochs * static_cast<double>(epoch_samples_);
      // Observations older than the latest one a window old are never "then" again:
      // dropped, so the scan stays a window long however long AHL lasts.
      auto old_enough = [&](const loss_seen& o) {
        return seconds ? o.t_s <= t_s - cfg_.plateau_window_s
                       : static_cast<double>(o.samples) <= static_cast<double>(samples) - window_samples;
      };
      size_t latest = 0;
      while (latest + 1 < losses_.size() && old_enough(losses_[latest + 1]))
        ++latest;
      losses_.erase(losses_.begin(), losses_.begin() + static_cast<std::ptrdiff_t>(latest));
      const loss_seen* then = old_enough(losses_.front()) ? &losses_.front() : nullptr;
      if (then && then->loss > 0) {
        double drop = (then->loss - loss) / then->loss;
        if (drop < cfg_.plateau_drop) {
          const std::string over =
            seconds ? "the last " + fixed(cfg_.plateau_window_s) + " s"
                    : std::to_string(samples - then->samples) + " samples (" + fixed(t_s - then->t_s)
                        + " s; window " + fixed3(cfg_.plateau_window_epochs) + " epochs)";
          change = ashl_event{t_s, ashl_stage::shl,
                              "training loss fell " + fixed(100 * drop) + "% over " + over + " (plateau below "
                                + fixed(100 * cfg_.plateau_drop) + "%)"};
        }
      }
    }
  }
  if (change) {
    stage_ = change->to;
    events_.push_back(*change);
  }
  return change;
}

std::map<uint32_t, uint32_t> ashl_planner::local_steps(const std::vector<ashl_worker>& live) const {
  std::map<uint32_t, uint32_t> out;
  const ashl_worker* slowest = nullptr;
  for (const auto& w : live)
    if (w.step_s > 0 && (!slowest || w.step_s > slowest->step_s))
      slowest = &w;
  uint32_t h = stage_ == ashl_stage::ahl ? cfg_.ahl_local_steps : cfg_.shl_local_steps;
  const double share = cfg_.max_comm_share;
  if (slowest && share > 0 && share < 1) {
    // comm / (H x t + comm) <= share  <=>  H >= comm (1 - share) / (share x t)
    double need = std::ceil(slowest->comm_s * (1 - share) / (share * slowest->step_s) - 1e-9);
    h = std::max(h, static_cast<uint32_t>(std::min<double>(need, cfg_.max_local_steps)));
  }
  for (const auto& w : live) {
    if (stage_ == ashl_stage::profiling || !slowest || w.step_s <= 0) {
      out[w.id] = 1;
      continue;
    }
    double period = h * slowest->step_s + slowest->comm_s;
    double hi = std::round((period - w.comm_s) / w.step_s);
    out[w.id] = static_cast<uint32_t>(std::clamp(hi, 1.0, static_cast<double>(cfg_.max_local_steps)));
  }
  return out;
}

uint64_t ashl_planner::allowed_gap() const {
  return stage_ == ashl_stage::shl ? cfg_.shl_gap : cfg_.ahl_gap;
}

float ashl_planner::lr_scale() const {
  return stage_ == ashl_stage::shl ? static_cast<float>(cfg_.shl_lr_scale) : 1.0f;
}

expected<std::unique_ptr<ashl_job_planner>> ashl_job_planner::make(const planner_context& ctx) {
  auto p = ashl_planner::make(ctx.job->ashl, ctx.train_size);
  if (!p)
    return p.error();
  if (ctx.resume_stage == "shl")
    p->resume_in(ashl_stage::shl);
  return std::unique_ptr<ashl_job_planner>(
    new ashl_job_planner(std::move(*p), push_topk_ratio(*ctx.job), ctx.job->pull_topk_ratio));
}

int ashl_job_planner::tick_ms() const {
  return ashl_tick_ms;
}

float ashl_job_planner::pull_ratio() const {
  return pull_ratio_set_ > 0 ? static_cast<float>(pull_ratio_set_) : planner_.pull_ratio();
}

stage_directive ashl_job_planner::directive(uint32_t local_steps) const {
  return stage_directive{to_string(planner_.stage()), local_steps, planner_.lr_scale(), pull_ratio()};
}

shard_settings ashl_job_planner::shard_state() const {
  shard_settings s;
  s.bound = std::make_pair(planner_.allowed_gap(), planner_.lr_scale());
  return s;
}

void ashl_job_planner::on_start(job_plan& out) {
  out.shards = shard_state();
}

void ashl_job_planner::on_join(worker_id w, job_plan& out) {
  // Slotted into the stage in force; profiled by its first steps.
  out.stages[w] = directive(1);
}

void ashl_job_planner::on_tick(const planner_view& view, job_plan& out) {
  std::vector<ashl_worker> live;
  for (const auto& w : view.workers) {
    // Communication per step, averaged by the profiler. Every step commits while
    // profiling; with H local steps per commit a step carries 1/H of a commit's, so the
    // commit's is H times the figure. It is measured again all the time (smoothed over
    // ticks): what a commit costs changes with the plan, with compressed pulls, and with
    // what else shares the network.
    double comm = std::max(0.0, w.step_s - w.compute_s - w.wait_s);
    auto h = sent_.find(w.id);
    auto c = comm_.find(w.id);
    if (planner_.stage() == ashl_stage::profiling || c == comm_.end() || h == sent_.end())
      comm_[w.id] = comm;
    else
      c->second = 0.7 * c->second + 0.3 * comm * std::max<uint32_t>(1, h->second);
    live.push_back(ashl_worker{w.id, w.compute_s, comm_[w.id], w.steps});
  }
  const bool profiling = planner_.stage() == ashl_stage::profiling;
  auto change = planner_.observe(view.t_s, view.loss, live, view.samples);
  if (profiling && change && pull_ratio_set_ <= 0 && planner_.pull_ratio() > 0) {
    // Pulls are compressed from now on: until measured again, a commit's communication
    // is taken to shrink with its bytes (a delta read moves 8 bytes for each of
    // pull_ratio x n entries instead of 4 bytes for each of n).
    const double push = push_ratio_ > 0 ? 2 * push_ratio_ : 1.0;
    const double factor = (push + 2 * planner_.pull_ratio()) / (push + 1);
    for (auto& w : live)
      w.comm_s = comm_[w.id] *= factor;
  }
  auto steps = planner_.local_steps(live);
  if (!change) {
    plan_local_steps(sent_, steps, out);
    return;
  }
  const std::string stage = to_string(change->to);
  out.info.push_back(fmt::format("ASHL stage {} at {:.1f} s (change {}): {}", stage, change->t_s,
                                 planner_.events().size(), change->why));
  out.events.push_back(plan_event{"stage " + stage, change->why});
  out.stage = static_cast<int>(change->to);
  out.shards = shard_state();
  std::string plan, basis;
  for (const auto& w : live)
    basis += fmt::format("{}{}: {:.1f} + {:.1f} ms", basis.empty() ? "" : ", ", w.id, 1e3 * w.step_s,
                         1e3 * w.comm_s);
  for (const auto& [id, h] : steps) {
    plan += (plan.empty() ? "" : ", ") + std::to_string(id) + ":" + std::to_string(h);
    sent_[id] = h;
    out.stages[id] = directive(h);
  }
  out.info.push_back(fmt::format("ASHL {}: allowed gap {} commits, local steps per commit {} (from compute per "
                                 "step + communication per commit: {})",
                                 stage, planner_.allowed_gap(), plan, basis));
}

// ---- ashl's own rules (runtime/policy/policy_rules.hpp): after the local-step family's.

void ashl_rules(rule_writer& w) {
  const auto& cfg = w.cfg;
  const double lr = w.lr, mu = cfg.optimizer.momentum;
  const double keep = std::sqrt(std::max(1e-6, 1.0 - mu));
  const std::string ws = w.workers_text();
  auto num = rule_number;
  // Each worker's own momentum (Polyak's, over its gradients only): with it, one
  // process needs fewer samples to a level (ops/bench/sequential_sgd.py); the step's
  // effective length lr / (1 - local momentum) stays the rule's.
  const double lm = user_set(cfg, "train.local_momentum") ? cfg.local_momentum : 0.5;
  w.change("train.local_momentum", num(lm), "each worker's momentum over its own gradients, in its local steps and commits");
  w.change("train.lr", num(lr / (2 * keep) * (1 - lm)),
           "train.lr " + num(lr) + " / (2 sqrt(1 - momentum " + num(mu) + ")) x (1 - local momentum " + num(lm)
             + "): local steps half as long as adsp's, their velocity's included");
  if (cfg.commit_scale == 0)
    w.change("train.commit_scale", num(std::min(1.0, 2.0 / w.workers)),
             "min(1, 2/" + ws + "): commits twice as heavy as an average's share, to match the shorter local steps");
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
  const double round_share = static_cast<double>(cfg.batch_size) / w.workers;
  const uint32_t by_round = std::max<uint32_t>(16, static_cast<uint32_t>(std::lround(round_share / 8)) * 8);
  const uint32_t batch = std::min(half, by_round);
  if (batch < cfg.batch_size)
    w.change("train.batch_size", std::to_string(batch),
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
    w.change("ashl.shl_lr_scale", "1",
             "train.lr_schedule " + setting_text(cfg, "train.lr_schedule")
               + " anneals the learning rate: SHL does not scale it again");
  if (cfg.ashl.max_comm_share > 0.1)
    w.change("ashl.max_comm_share", "0.1",
             "communication held to 0.1 of the slowest worker's commit period: more local steps per commit");
}

void ashl_script_rules(rule_writer& w) {
  const std::string own = "train.optimizer script: ";
  // Adam-like steps are of about one size in every entry: top-k keeps little of a delta
  // (ops/bench/hvd_hetero.py, AdamW at 1,1,2,4: best accuracy 0.869 with ashl's 10%
  // pushes and pulls, 0.874-0.876 dense, on one host).
  w.change("ashl.topk_ratio", "0", own + "dense commits: the script's optimizer's deltas do not sparsify as gradients do");
  w.change("ashl.pull_topk_ratio", "0", own + "dense pulls, as the commits");
  if (w.cfg.commit_scale == 0)
    w.change("train.commit_scale", rule_number(std::min(1.0, 2.0 / w.workers)),
             "min(1, 2/" + w.workers_text() + "): as ashl's commits of gradients, twice an average's share");
}

}  // namespace ashlar
