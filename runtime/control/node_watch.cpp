#include "runtime/control/node_watch.hpp"

namespace ashlar::control {

void node_watch::watch(uint32_t id) {
  const uint64_t now = clock_.steady_ns();
  nodes_[id] = seen{now, now};
}

void node_watch::answered(uint32_t id) {
  if (auto i = nodes_.find(id); i != nodes_.end())
    i->second.answered_ns = clock_.steady_ns();
}

std::vector<uint32_t> node_watch::to_ping() {
  const uint64_t now = clock_.steady_ns();
  std::vector<uint32_t> out;
  for (auto& [id, s] : nodes_)
    if (now - s.pinged_ns >= timing_.interval_ns) {
      s.pinged_ns = now;
      out.push_back(id);
    }
  return out;
}

std::vector<uint32_t> node_watch::silent() {
  const uint64_t now = clock_.steady_ns();
  std::vector<uint32_t> out;
  for (auto i = nodes_.begin(); i != nodes_.end();) {
    if (now - i->second.answered_ns >= timing_.timeout_ns) {
      out.push_back(i->first);
      i = nodes_.erase(i);
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace ashlar::control
