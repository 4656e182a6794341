#include "apps/ashlar/host.hpp"

namespace ashlar::cli {

namespace {

actors::backend_factory& host_factory() {
  static actors::backend_factory f;
  return f;
}

}  // namespace

void set_host_backend(actors::backend_factory make) {
  host_factory() = std::move(make);
}

const actors::backend_factory& host_backend() {
  return host_factory();
}

}  // namespace ashlar::cli
