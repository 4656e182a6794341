#include "runtime/control/host_plan.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "runtime/control/rendezvous.hpp"

namespace ashlar::control {

namespace {

constexpr uint32_t max_slots = 4096; // a node's most (the scheduler's node table)

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return s.substr(b, e - b);
}

// A positive slot count of at most max_slots, or an error naming `where`.
expected<uint32_t> slot_count(const std::string& text, const std::string& where) {
  bool digits = !text.empty() && text.size() <= 6;
  for (char c : text)
    digits = digits && std::isdigit(static_cast<unsigned char>(c));
  const unsigned long n = digits ? std::stoul(text) : 0;
  if (n == 0 || n > max_slots)
    return make_error(errc::invalid_argument, where + ": slots '" + text + "' is not a count from 1 to "
                                                + std::to_string(max_slots));
  return static_cast<uint32_t>(n);
}

// A host name or address: letters, digits, '.', '-', '_', or [IPv6] / an IPv6 address.
bool valid_host(const std::string& h) {
  if (h.empty() || h.size() > 253 || h.front() == '-')
    return false;
  for (char c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' && c != ':' && c != '['
        && c != ']')
      return false;
  return true;
}

// "host", "host:N", "[v6]:N", "[v6]" or a bare IPv6 address (one slot).
expected<host_slots> parse_entry(const std::string& raw, const std::string& where) {
  const std::string e = trim(raw);
  host_slots h;
  h.where = where;
  std::string count;
  bool counted = false;
  if (!e.empty() && e.front() == '[') {
    const auto close = e.find(']');
    if (close == std::string::npos)
      return make_error(errc::invalid_argument, where + ": '" + e + "' opens '[' without closing it");
    h.host = e.substr(0, close + 1);
    if (close + 1 < e.size()) {
      if (e[close + 1] != ':')
        return make_error(errc::invalid_argument, where + ": '" + e + "' is not HOST or HOST:SLOTS");
      count = e.substr(close + 2);
      counted = true;
    }
  } else if (std::count(e.begin(), e.end(), ':') == 1) {
    const auto colon = e.find(':');
    h.host = e.substr(0, colon);
    count = e.substr(colon + 1);
    counted = true;
  } else {
    h.host = e;
  }
  if (!valid_host(h.host))
    return make_error(errc::invalid_argument, where + ": '" + e + "' does not name a host (HOST or HOST:SLOTS)");
  if (counted) {
    auto n = slot_count(count, where);
    if (!n)
      return n.error();
    h.slots = *n;
  }
  return h;
}

// Refuses a host written twice, naming both places.
caf::error check_unique(const std::vector<host_slots>& hosts) {
  for (size_t i = 0; i < hosts.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (hosts[i].host == hosts[j].host)
        return make_error(errc::invalid_argument, hosts[i].where + ": host " + hosts[i].host + " is named again (first at "
                                                    + hosts[j].where + "); give it once, with all its slots");
  return caf::none;
}

} // namespace

expected<std::vector<host_slots>> parse_host_list(const std::string& list) {
  std::vector<host_slots> out;
  std::stringstream in{list};
  std::string part;
  size_t index = 0;
  while (std::getline(in, part, ',')) {
    ++index;
    auto h = parse_entry(part, "--hosts entry " + std::to_string(index));
    if (!h)
      return h.error();
    out.push_back(*h);
  }
  if (out.empty())
    return make_error(errc::invalid_argument, "--hosts names no host (write h1:4,h2:2)");
  if (auto err = check_unique(out))
    return err;
  return out;
}

expected<std::vector<host_slots>> parse_hostfile(const std::string& text, const std::string& file) {
  std::vector<host_slots> out;
  std::stringstream in{text};
  std::string line;
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = file + ":" + std::to_string(number);
    line = trim(line.substr(0, line.find('#')));
    if (line.empty())
      continue;
    std::stringstream words{line};
    std::string host, word;
    words >> host;
    auto h = parse_entry(host, where);
    if (!h)
      return h.error();
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0 || word.rfind("max_slots=", 0) == 0) {
        if (word[0] == 'm')
          continue; // Open MPI's ceiling: the slots are what runs
        auto n = slot_count(word.substr(6), where);
        if (!n)
          return n.error();
        h->slots = *n;
      } else {
        return make_error(errc::invalid_argument, where + ": '" + word + "' is not slots=N (a line is HOST slots=N)");
      }
    }
    out.push_back(*h);
  }
  if (out.empty())
    return make_error(errc::invalid_argument, file + " names no host (one per line: HOST slots=N)");
  if (auto err = check_unique(out))
    return err;
  return out;
}

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']')
    h = h.substr(1, h.size() - 2);
  return is_loopback_address(h);
}

expected<host_plan> plan_hosts(const std::vector<host_slots>& hosts, uint32_t workers, uint32_t servers) {
  if (hosts.empty())
    return make_error(errc::invalid_argument, "the launch names no host");
  if (servers == 0)
    return make_error(errc::invalid_config, "train.servers is 0: a job needs at least one server node");
  uint64_t offered = 0;
  for (const auto& h : hosts)
    offered += h.slots;
  if (workers == 0)
    workers = static_cast<uint32_t>(offered);
  if (workers > offered)
    return make_error(errc::invalid_config, std::to_string(workers) + " workers asked for, but the hosts offer "
                                              + std::to_string(offered) + " slots (" + hosts.front().where
                                              + "...): give more hosts or slots, or ask for fewer workers");
  host_plan plan;
  plan.workers = workers;
  plan.servers = servers;
  for (uint32_t i = 0; i < servers; ++i) {
    const auto& h = hosts[i % hosts.size()];
    plan.nodes.push_back({host_node::server, h.host, 0, "server-" + std::to_string(i) + "@" + h.host});
  }
  uint32_t left = workers;
  for (const auto& h : hosts) {
    if (left == 0)
      break;
    const uint32_t n = std::min(left, h.slots);
    plan.nodes.push_back({host_node::worker, h.host, n, "worker@" + h.host});
    left -= n;
  }
  for (const auto& n : plan.nodes)
    plan.loopback_only = plan.loopback_only && is_loopback_host(n.host);
  return plan;
}

std::string host_plan::describe() const {
  std::string out;
  std::vector<std::string> order;
  for (const auto& n : nodes)
    if (std::find(order.begin(), order.end(), n.host) == order.end())
      order.push_back(n.host);
  for (const auto& h : order) {
    std::string parts;
    for (const auto& n : nodes) {
      if (n.host != h)
        continue;
      if (!parts.empty())
        parts += ", ";
      parts += n.kind == host_node::worker ? std::to_string(n.slots) + (n.slots == 1 ? " worker" : " workers")
                                           : n.name.substr(0, n.name.find('@'));
    }
    out += (out.empty() ? "" : "; ") + h + ": " + parts;
  }
  return out;
}

} // namespace ashlar::control
