#include "runtime/data/data_source.hpp"

namespace ashlar {

expected<data_source_kind> parse_data_source(const std::string& name) {
  if (name == "fashion-mnist")
    return data_source_kind::fashion_mnist;
  if (name == "npy")
    return data_source_kind::npy;
  if (name == "synthetic")
    return data_source_kind::synthetic;
  return make_error(errc::invalid_config, "data.source must be fashion-mnist, npy or synthetic, not '" + name + "'");
}

const char* to_string(data_source_kind k) {
  switch (k) {
    case data_source_kind::fashion_mnist:
      return "fashion-mnist";
    case data_source_kind::npy:
      return "npy";
    case data_source_kind::synthetic:
      return "synthetic";
  }
  return "fashion-mnist";
}

}  // namespace ashlar
