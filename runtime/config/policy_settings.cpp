#include "runtime/config/policy_settings.hpp"

namespace ashlar {

expected<ashl_rule> parse_ashl_rule(const std::string& name) {
  if (name == "plateau")
    return ashl_rule::plateau;
  if (name == "loss")
    return ashl_rule::loss;
  return make_error(errc::invalid_config, "ashl.rule: '" + name + "' is not a rule (plateau or loss)");
}

const char* to_string(ashl_rule r) {
  return r == ashl_rule::loss ? "loss" : "plateau";
}

}  // namespace ashlar
