#include "runtime/policy/ashl.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ashlar {

namespace {

// One decimal: "3.3".
std::string fixed(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

// Three decimals: "0.497".
std::string fixed3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", x);
  return buf;
}

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

expected<ashl_planner> ashl_planner::make(ashl_config cfg) {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_config, "ashl." + what); };
  if (cfg.rule != "plateau" && cfg.rule != "loss")
    return bad("rule: '" + cfg.rule + "' is not a rule (plateau or loss)");
  if (cfg.ahl_local_steps == 0 || cfg.shl_local_steps == 0)
    return bad("ahl_local_steps and shl_local_steps must be at least 1");
  if (cfg.max_local_steps < std::max(cfg.ahl_local_steps, cfg.shl_local_steps))
    return bad("max_local_steps (" + std::to_string(cfg.max_local_steps)
               + ") is below a stage's local steps");
  if (!(cfg.plateau_window_s > 0) || !(cfg.plateau_drop >= 0 && cfg.plateau_drop < 1))
    return bad("plateau_window_s must be > 0 and plateau_drop in [0, 1)");
  if (!(cfg.shl_lr_scale > 0 && cfg.shl_lr_scale <= 1))
    return bad("shl_lr_scale must be in (0, 1]");
  if (!(cfg.pull_topk_ratio >= 0 && cfg.pull_topk_ratio < 0.5))
    return bad("pull_topk_ratio must be in [0, 0.5): from 0.5 on a delta read is no smaller than a dense one");
  if (!(cfg.max_comm_share > 0 && cfg.max_comm_share <= 1))
    return bad("max_comm_share must be in (0, 1]");
  if (!(cfg.pull_compress_above >= 0))
    return bad("pull_compress_above must be >= 0");
  return ashl_planner{std::move(cfg)};
}

std::optional<ashl_event> ashl_planner::observe(double t_s, double loss, const std::vector<ashl_worker>& live) {
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
    losses_.emplace_back(t_s, loss);
    if (cfg_.rule == "loss") {
      if (loss <= cfg_.switch_loss)
        change = ashl_event{t_s, ashl_stage::shl,
                            "training loss " + fixed3(loss) + " <= " + fixed3(cfg_.switch_loss)};
    } else {
      // The loss a window ago: the latest observation at least plateau_window_s old.
      const std::pair<double, double>* then = nullptr;
      for (const auto& o : losses_)
        if (o.first <= t_s - cfg_.plateau_window_s)
          then = &o;
      if (then && then->second > 0) {
        double drop = (then->second - loss) / then->second;
        if (drop < cfg_.plateau_drop)
          change = ashl_event{t_s, ashl_stage::shl,
                              "training loss fell " + fixed(100 * drop) + "% in the last "
                                + fixed(cfg_.plateau_window_s) + " s (plateau below "
                                + fixed(100 * cfg_.plateau_drop) + "%)"};
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
  return stage_ == ashl_stage::ahl ? cfg_.ahl_gap : cfg_.shl_gap;
}

float ashl_planner::lr_scale() const {
  return stage_ == ashl_stage::shl ? static_cast<float>(cfg_.shl_lr_scale) : 1.0f;
}

}  // namespace ashlar
