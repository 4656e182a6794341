#include "runtime/control/cluster_membership.hpp"

#include <algorithm>

namespace ashlar::control {

cluster_membership::admission cluster_membership::on_join(uint32_t id, bool server, uint32_t slots,
                                                          const std::string& connection) {
  admission a;
  if (!connection.empty())
    for (const auto& [other, n] : nodes_)
      if (n.live && n.connection == connection && other != id)
        a.replaces = other;
  if (nodes_.count(id) == 0 && live_nodes() - (a.replaces ? 1 : 0) >= limits_.max_nodes) {
    a.replaces.reset();
    a.note = "the cluster holds " + std::to_string(limits_.max_nodes) + " nodes, its most";
    return a;
  }
  a.admitted = true;
  a.slots = std::min(slots, limits_.slots_per_node);
  if (a.slots < slots)
    a.note = "offered " + std::to_string(slots) + " worker slots; a node is granted at most "
             + std::to_string(limits_.slots_per_node);
  nodes_[id] = node{true, false, server, a.slots, 0, connection};
  return a;
}

bool cluster_membership::on_confirmed(uint32_t id) {
  auto n = nodes_.find(id);
  if (n == nodes_.end() || !n->second.live || n->second.confirmed)
    return false;
  n->second.confirmed = true;
  return true;
}

bool cluster_membership::confirm_due(uint32_t id) const {
  auto n = nodes_.find(id);
  return n != nodes_.end() && n->second.live && !n->second.confirmed;
}

bool cluster_membership::serving(uint32_t id) const {
  auto n = nodes_.find(id);
  return n != nodes_.end() && n->second.live && n->second.confirmed;
}

uint32_t cluster_membership::on_lost(uint32_t id) {
  auto n = nodes_.find(id);
  if (n == nodes_.end() || !n->second.live)
    return 0;
  n->second.live = false;
  const uint32_t lost = n->second.job_workers;
  n->second.job_workers = 0;
  nodes_.erase(n); // a node that comes back joins as a new one
  return lost;
}

capacity cluster_membership::free() const {
  capacity c;
  for (const auto& [id, n] : nodes_) {
    if (!n.live || !n.confirmed)
      continue;
    c.server_nodes += n.server ? 1 : 0;
    c.worker_slots += n.slots > n.job_workers ? n.slots - n.job_workers : 0;
  }
  return c;
}

void cluster_membership::job_started(uint32_t workers, const std::map<uint32_t, uint32_t>& placed) {
  job_size_ = workers;
  for (auto& [id, n] : nodes_)
    n.job_workers = 0;
  for (const auto& [id, k] : placed)
    if (auto n = nodes_.find(id); n != nodes_.end())
      n->second.job_workers += k;
}

uint32_t cluster_membership::to_start_on(uint32_t id) const {
  auto n = nodes_.find(id);
  if (job_size_ == 0 || n == nodes_.end() || !n->second.live || !n->second.confirmed)
    return 0;
  const uint32_t have = job_workers();
  const uint32_t lacking = job_size_ > have ? job_size_ - have : 0;
  const uint32_t free_slots = n->second.slots > n->second.job_workers ? n->second.slots - n->second.job_workers : 0;
  return std::min(lacking, free_slots);
}

void cluster_membership::placed(uint32_t id, uint32_t k) {
  if (auto n = nodes_.find(id); n != nodes_.end())
    n->second.job_workers += k;
}

void cluster_membership::ended(uint32_t id, uint32_t k) {
  if (auto n = nodes_.find(id); n != nodes_.end())
    n->second.job_workers -= std::min(k, n->second.job_workers);
}

void cluster_membership::job_ended() {
  job_size_ = 0;
  for (auto& [id, n] : nodes_)
    n.job_workers = 0;
}

uint32_t cluster_membership::job_workers() const {
  uint32_t k = 0;
  for (const auto& [id, n] : nodes_)
    k += n.live ? n.job_workers : 0;
  return k;
}

uint32_t cluster_membership::live_nodes() const {
  uint32_t k = 0;
  for (const auto& [id, n] : nodes_)
    k += n.live ? 1 : 0;
  return k;
}

}  // namespace ashlar::control
