#include "runtime/control/rendezvous.hpp"

#include <cstdlib>
#include <set>

namespace ashlar::control {

namespace {

caf::error bad_list(const std::string& list, const std::string& why) {
  return make_error(errc::invalid_argument, "host list '" + list + "': " + why);
}

// The entries of `s` split at commas outside brackets.
expected<std::vector<std::string>> split_top(const std::string& s, const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[' && ++depth > 1)
      return bad_list(list, "nested '['");
    if (c == ']' && --depth < 0)
      return bad_list(list, "']' without '['");
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0)
    return bad_list(list, "'[' without ']'");
  out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) {
  if (s.empty())
    return false;
  for (char c : s)
    if (c < '0' || c > '9')
      return false;
  return true;
}

// The items of one bracket's body ("01-03,7"), zero padding kept.
expected<std::vector<std::string>> range_items(const std::string& body, const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    const std::string part = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t dash = part.find('-');
    const std::string lo = part.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9)
      return bad_list(list, "'" + part + "' is not a number or a range of numbers");
    const long a = std::atol(lo.c_str()), b = std::atol(hi.c_str());
    if (b < a)
      return bad_list(list, "range '" + part + "' runs backwards");
    if (b - a >= 65536 || out.size() + static_cast<size_t>(b - a) >= 65536)
      return bad_list(list, "more than 65536 hosts");
    for (long v = a; v <= b; ++v) {
      std::string n = std::to_string(v);
      if (n.size() < lo.size())
        n = std::string(lo.size() - n.size(), '0') + n;
      out.push_back(n);
    }
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return out;
}

// One entry with any number of bracket groups ("rack[1-2]-n[01-02]"), expanded.
caf::error expand_entry(const std::string& entry, const std::string& list, std::vector<std::string>& out) {
  const size_t open = entry.find('[');
  if (open == std::string::npos) {
    out.push_back(entry);
    return caf::none;
  }
  const size_t close = entry.find(']', open);
  auto items = range_items(entry.substr(open + 1, close - open - 1), list);
  if (!items)
    return items.error();
  const std::string prefix = entry.substr(0, open), rest = entry.substr(close + 1);
  for (const auto& item : *items)
    if (auto err = expand_entry(prefix + item + rest, list, out))
      return err;
  if (out.size() > 65536)
    return bad_list(list, "more than 65536 hosts");
  return caf::none;
}

std::string get(const env_lookup& env, const char* name) {
  const char* v = env(name);
  return v ? std::string{v} : std::string{};
}

// A port from variable `name`'s value `v`; an error names it.
expected<uint16_t> port_of(const std::string& v, const char* name) {
  if (!all_digits(v) || v.size() > 5 || std::atol(v.c_str()) < 1 || std::atol(v.c_str()) > 65535)
    return make_error(errc::invalid_argument, std::string{name} + "=" + v + " is not a port (1-65535)");
  return static_cast<uint16_t>(std::atol(v.c_str()));
}

expected<rendezvous> from_slurm(const env_lookup& env) {
  rendezvous r;
  r.manager = "slurm";
  for (const char* name : {"SLURM_JOB_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (!get(env, name).empty()) {
      r.source = name;
      break;
    }
  if (r.source.empty())
    return make_error(errc::invalid_argument, "SLURM_JOB_ID is set but none of SLURM_JOB_NODELIST_HET_GROUP_0, "
                                              "SLURM_JOB_NODELIST, SLURM_NODELIST is: not inside a Slurm job?");
  auto first = expand_hostlist(get(env, r.source.c_str()));
  if (!first)
    return make_error(errc::invalid_argument, r.source + ": " + describe(first.error()));
  if (first->empty() || first->front().empty())
    return make_error(errc::invalid_argument, r.source + " names no host");
  r.host = first->front();
  // The hosts of every component (a het job's SLURM_JOB_NODELIST is its first component's).
  std::set<std::string> hosts(first->begin(), first->end());
  r.hosts_source = r.source;
  const std::string het = get(env, "SLURM_HET_SIZE");
  if (r.source == "SLURM_JOB_NODELIST_HET_GROUP_0" && all_digits(het)) {
    const long n = std::atol(het.c_str());
    for (long k = 1; k < n && k < 1024; ++k) {
      const std::string name = "SLURM_JOB_NODELIST_HET_GROUP_" + std::to_string(k);
      auto more = expand_hostlist(get(env, name.c_str()));
      if (!more)
        return make_error(errc::invalid_argument, name + ": " + describe(more.error()));
      hosts.insert(more->begin(), more->end());
    }
    r.hosts_source = "SLURM_JOB_NODELIST_HET_GROUP_0.." + std::to_string(n - 1);
  }
  r.hosts = static_cast<uint32_t>(hosts.size());
  const std::string port = get(env, "ASHLAR_PORT");
  if (!port.empty()) {
    auto p = port_of(port, "ASHLAR_PORT");
    if (!p)
      return p.error();
    r.port = *p;
  } else {
    const std::string id = get(env, "SLURM_JOB_ID");
    if (!all_digits(id) || id.size() > 18)
      return make_error(errc::invalid_argument, "SLURM_JOB_ID=" + id + " is not a job id");
    r.port = static_cast<uint16_t>(20000 + std::stoull(id) % 10000);
  }
  return r;
}

expected<rendezvous> from_kubernetes(const env_lookup& env, const char* addr_var, const char* port_var,
                                     const char* size_var) {
  rendezvous r;
  r.manager = "kubernetes";
  r.source = addr_var;
  r.host = get(env, addr_var);
  std::string port = get(env, "ASHLAR_PORT");
  const char* port_name = "ASHLAR_PORT";
  if (port.empty()) {
    port = get(env, port_var);
    port_name = port_var;
  }
  if (port.empty())
    return make_error(errc::invalid_argument, std::string{addr_var} + " is set but neither " + port_var
                                                + " nor ASHLAR_PORT is");
  auto p = port_of(port, port_name);
  if (!p)
    return p.error();
  r.port = *p;
  const std::string size = get(env, size_var);
  if (all_digits(size) && size.size() < 7) {
    r.hosts = static_cast<uint32_t>(std::atol(size.c_str()));
    r.hosts_source = size_var;
  }
  return r;
}

} // namespace

expected<std::vector<std::string>> expand_hostlist(const std::string& list) {
  std::vector<std::string> out;
  if (list.empty())
    return out;
  auto entries = split_top(list, list);
  if (!entries)
    return entries.error();
  for (const auto& e : *entries) {
    if (e.empty())
      return bad_list(list, "an empty entry");
    if (auto err = expand_entry(e, list, out))
      return err;
  }
  return out;
}

expected<rendezvous> rendezvous_from_env(const env_lookup& env) {
  const std::string join = get(env, "ASHLAR_JOIN");
  if (!join.empty()) {
    const size_t colon = join.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return make_error(errc::invalid_argument, "ASHLAR_JOIN=" + join + " is not HOST:PORT");
    auto p = port_of(join.substr(colon + 1), "ASHLAR_JOIN's port");
    if (!p)
      return p.error();
    rendezvous r;
    r.manager = "ashlar";
    r.source = "ASHLAR_JOIN";
    r.host = join.substr(0, colon);
    if (r.host.size() > 2 && r.host.front() == '[' && r.host.back() == ']')
      r.host = r.host.substr(1, r.host.size() - 2);
    r.port = *p;
    return r;
  }
  if (!get(env, "SLURM_JOB_ID").empty())
    return from_slurm(env);
  if (!get(env, "MASTER_ADDR").empty())
    return from_kubernetes(env, "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE");
  if (!get(env, "PET_MASTER_ADDR").empty())
    return from_kubernetes(env, "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES");
  return make_error(errc::invalid_argument,
                    "--join auto: no workload manager's variables are set (ASHLAR_JOIN, Slurm's SLURM_JOB_ID and "
                    "node lists, MASTER_ADDR/MASTER_PORT or PET_MASTER_ADDR/PET_MASTER_PORT); give --join HOST:PORT");
}

bool is_loopback_address(const std::string& a) {
  return a.rfind("127.", 0) == 0 || a == "::1" || a.rfind("::ffff:127.", 0) == 0 || a == "localhost";
}

caf::error check_not_loopback(const rendezvous& r, const std::vector<std::string>& resolved) {
  if (r.hosts <= 1)
    return caf::none;
  for (const auto& a : resolved)
    if (is_loopback_address(a))
      return make_error(errc::invalid_argument,
                        "the scheduler's address " + r.host + " (from " + r.source + ") resolves to " + a
                          + ", this host's loopback, while the job spans " + std::to_string(r.hosts) + " hosts ("
                          + r.hosts_source + "): every host would look for the scheduler on itself. Make " + r.host
                          + " resolve to its address on the cluster's network (/etc/hosts, DNS), or set "
                            "ASHLAR_JOIN=ADDRESS:PORT");
  return caf::none;
}

}  // namespace ashlar::control
