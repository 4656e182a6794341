// The table of sync policies: adding a policy is one file and one row here. A row names
// the policy's shard side, its job planner (if the scheduler plans anything for it) and
// its traits.
#include <functional>

#include <spdlog/spdlog.h>

#include "runtime/policy/batch_planner.hpp"
#include "runtime/config/train_config.hpp"

#include "runtime/policy/adaptive_k.hpp"
#include "runtime/policy/adsp.hpp"
#include "runtime/policy/ashl.hpp"
#include "runtime/policy/asp.hpp"
#include "runtime/policy/bsp.hpp"
#include "runtime/policy/k_sync.hpp"
#include "runtime/policy/ring.hpp"
#include "runtime/policy/ssp.hpp"

namespace ashlar {

sync_policy::~sync_policy() = default;

namespace {

struct entry {
  const char* name;
  std::function<std::unique_ptr<sync_policy>(const policy_config&)> make;
  /// The policy's job planner; null: the scheduler plans nothing for it.
  std::function<expected<std::unique_ptr<job_planner>>(const planner_context&)> plan = nullptr;
  bool commits = false;
  bool ring = false;
  /// The push compression when train.topk_ratio is 0; null: dense.
  double (*push_topk)(const train_config&) = nullptr;
  rule_family rules = rule_family::averaged;
  void (*own_rules)(rule_writer&) = nullptr;
  void (*own_script_rules)(rule_writer&) = nullptr;
};

expected<std::unique_ptr<job_planner>> plan_ashl(const planner_context& ctx) {
  auto p = ashl_job_planner::make(ctx);
  if (!p)
    return p.error();
  return std::unique_ptr<job_planner>(std::move(*p));
}

const std::vector<entry>& table() {
  using f = rule_family;
  static const std::vector<entry> rows = {
    {"bsp", [](const policy_config&) { return std::make_unique<bsp_policy>(); }},
    {"asp", [](const policy_config& c) { return std::make_unique<asp_policy>(c); }, nullptr, false, false, nullptr,
     f::async_push},
    {"ssp", [](const policy_config& c) { return std::make_unique<ssp_policy>(c); }, nullptr, false, false, nullptr,
     f::async_push},
    {"ksync", [](const policy_config& c) { return std::make_unique<k_sync_policy>(c); }, nullptr, false, false,
     nullptr, f::k_of_w},
    {"kasync", [](const policy_config& c) { return std::make_unique<k_async_policy>(c); }, nullptr, false, false,
     nullptr, f::async_push},
    {"adsp", [](const policy_config&) { return std::make_unique<adsp_policy>(); },
     [](const planner_context&) -> expected<std::unique_ptr<job_planner>> {
       return std::unique_ptr<job_planner>(std::make_unique<adsp_job_planner>());
     },
     /*commits=*/true, false, nullptr, f::local_steps},
    {"adaptive", [](const policy_config& c) { return std::make_unique<adaptive_k_policy>(c); },
     [](const planner_context&) -> expected<std::unique_ptr<job_planner>> {
       return std::unique_ptr<job_planner>(std::make_unique<adaptive_k_job_planner>());
     },
     false, false, nullptr, f::async_push},
    {"ashl", [](const policy_config& c) { return std::make_unique<ashl_policy>(c); }, plan_ashl,
     /*commits=*/true, /*ring=*/false, [](const train_config& j) { return j.ashl.topk_ratio; }, f::local_steps,
     ashl_rules, ashl_script_rules},
    {"ring", [](const policy_config&) { return std::make_unique<ring_policy>(); }, nullptr, false,
     /*ring=*/true},
  };
  return rows;
}

const entry* find(const std::string& name) {
  for (const auto& e : table())
    if (name == e.name)
      return &e;
  return nullptr;
}

// A planner with nothing to plan.
class idle_planner final : public job_planner {
public:
  bool plans() const override { return false; }
  void on_tick(const planner_view&, job_plan&) override {}
};

}  // namespace

policy_traits traits_of(const std::string& name) {
  policy_traits t;
  const entry* e = find(name);
  if (e == nullptr)
    return t;
  t.lockstep = e->make(policy_config{})->lockstep();
  t.commits = e->commits;
  t.ring = e->ring;
  t.rules = e->rules;
  t.own_rules = e->own_rules;
  t.own_script_rules = e->own_script_rules;
  return t;
}

double push_topk_ratio(const train_config& job) {
  const entry* e = find(job.policy);
  if (e != nullptr && e->ring)
    return 0.0; // its pushes mirror the model
  if (job.topk_ratio > 0)
    return job.topk_ratio;
  return e != nullptr && e->push_topk != nullptr ? e->push_topk(job) : 0.0;
}

std::unique_ptr<job_planner> make_job_planner(const planner_context& ctx) {
  std::vector<std::unique_ptr<job_planner>> parts;
  if (const entry* e = find(ctx.job->policy); e != nullptr && e->plan) {
    if (auto p = e->plan(ctx))
      parts.push_back(std::move(*p));
    else // the configuration was validated before; say so if it was not
      spdlog::error("{} planner: {}", e->name, describe(p.error()));
  }
  if (ctx.job->allocation != allocation_mode::equal)
    parts.push_back(std::make_unique<batch_planner>(ctx.job->allocation, ctx));
  if (parts.empty())
    return std::make_unique<idle_planner>();
  if (parts.size() == 1)
    return std::move(parts.front());
  return std::make_unique<combined_planner>(std::move(parts));
}

std::vector<std::string> policy_names() {
  std::vector<std::string> out;
  for (const auto& e : table())
    out.emplace_back(e.name);
  return out;
}

expected<std::unique_ptr<sync_policy>> make_policy(const std::string& name,
                                                   const policy_config& cfg) {
  for (const auto& e : table())
    if (name == e.name)
      return e.make(cfg);
  std::string known;
  for (const auto& n : policy_names())
    known += (known.empty() ? "" : ", ") + n;
  return make_error(errc::unknown_name, "unknown sync policy '" + name + "' (known: " + known + ")");
}

}  // namespace ashlar
