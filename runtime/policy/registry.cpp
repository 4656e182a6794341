// The table of sync policies: adding a policy is one file and one row here.
#include <functional>

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
};

const std::vector<entry>& table() {
  static const std::vector<entry> rows = {
    {"bsp", [](const policy_config&) { return std::make_unique<bsp_policy>(); }},
    {"asp", [](const policy_config& c) { return std::make_unique<asp_policy>(c); }},
    {"ssp", [](const policy_config& c) { return std::make_unique<ssp_policy>(c); }},
    {"ksync", [](const policy_config& c) { return std::make_unique<k_sync_policy>(c); }},
    {"kasync", [](const policy_config& c) { return std::make_unique<k_async_policy>(c); }},
    {"adsp", [](const policy_config&) { return std::make_unique<adsp_policy>(); }},
    {"adaptive", [](const policy_config& c) { return std::make_unique<adaptive_k_policy>(c); }},
    {"ashl", [](const policy_config& c) { return std::make_unique<ashl_policy>(c); }},
    {"ring", [](const policy_config&) { return std::make_unique<ring_policy>(); }},
  };
  return rows;
}

}  // namespace

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
