#include "runtime/config/allocation_mode.hpp"

namespace ashlar {

expected<allocation_mode> parse_allocation(const std::string& name) {
  if (name == "equal")
    return allocation_mode::equal;
  if (name == "proportional")
    return allocation_mode::proportional;
  if (name == "adaptive") // not-a-policy-name: the allocation mode
    return allocation_mode::adaptive;
  if (name == "predicted")
    return allocation_mode::predicted;
  return make_error(errc::invalid_config,
                    "train.allocation '" + name + "' is not known (known: equal, proportional, adaptive, predicted)");
}

const char* to_string(allocation_mode m) {
  switch (m) {
    case allocation_mode::equal:
      return "equal";
    case allocation_mode::proportional:
      return "proportional";
    case allocation_mode::adaptive:
      return "adaptive";
    case allocation_mode::predicted:
      return "predicted";
  }
  return "equal";
}

}  // namespace ashlar
