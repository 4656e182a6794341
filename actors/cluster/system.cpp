#include "actors/cluster/system.hpp"

#include "actors/cluster/network.hpp"

#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include <caf/detail/get_root_uuid.hpp>
#include <caf/io/all.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/native_socket.hpp>
#include <unistd.h>

#include "runtime/core/clock.hpp"
#include "runtime/net/handshake.hpp"
#include "runtime/net/socket.hpp"

// CAF 0.17.6 names a process (its node_id) by a hash of the host's MAC addresses and root
// disk UUID, and its process id: every process of a host differs by its pid alone. Pids are
// reused, and fast on a host that starts and kills many processes (a storm of node processes
// and their threads wraps 32,768 pids in about a minute): a node that gets the pid of one that
// died is taken for the dead one by every peer that still knows it (the transport drops its
// handshake as "repeated" and routes its messages to the old connection, and the servers'
// proxies of the dead node's workers reach the newcomer's actors). CAF 0.18 adds random
// characters to what it hashes; this gives 0.17.6 the same: CAF calls this function (through
// the dynamic linker, so the program's definition is the one used) once per actor system, and
// each call returns a fresh random 128-bit string, so no two processes share a node_id.
namespace caf::detail {
std::string get_root_uuid() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    char part[9];
    std::snprintf(part, sizeof part, "%08x", static_cast<unsigned>(rd()));
    out += part;
  }
  return out;
}
} // namespace caf::detail

namespace ashlar::actors {

expected<endpoint> parse_endpoint(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return make_error(errc::invalid_argument, "'" + text + "' is not HOST:PORT");
  endpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']')
    e.host = e.host.substr(1, e.host.size() - 2);
  auto port_text = text.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port < 0 || port > 65535)
    return make_error(errc::invalid_argument, "'" + port_text + "' in '" + text + "' is not a port");
  e.port = static_cast<uint16_t>(port);
  return e;
}

cluster_system_config::cluster_system_config() {
  register_types(*this);
  set_fair_scheduling(*this);
  load<caf::io::middleman>();
  set("middleman.heartbeat-interval", caf::timespan{heartbeat_interval});
  set("middleman.connection-timeout", caf::timespan{connection_timeout});
  // Nodes log through spdlog; keep CAF's own console output quiet.
  set("logger.console-verbosity", caf::atom("quiet"));
  // Several node processes often share a few cores: the work-sharing scheduler sleeps on a
  // condition variable instead of spinning the way work stealing polls for jobs.
  set("scheduler.policy", caf::atom("sharing"));
  set("scheduler.max-threads", size_t{2});
  // Node-to-node traffic (worker <-> shard) is routed through the scheduler's connections:
  // CAF's automatic direct connections advertise every interface address of a node, which
  // is not what a user who gave loopback or one cluster address expects.
  set("middleman.enable-automatic-connections", false);
}

caf::error probe_admission(caf::actor_system& sys, const endpoint& where, std::chrono::milliseconds timeout) {
  auto net = network_of(sys);
  if (!net)
    return make_error(errc::invalid_state, "no cluster network is set up in this process "
                                           "(cluster_network::start)");
  // A frozen process's full listen backlog would block a plain connect for minutes.
  auto sock = net::connect_tcp(where.host, where.port, timeout);
  if (!sock)
    return sock.error();
  const int fd = sock->fd();
  caf::io::network::nonblocking(fd, true);
  caf::error out;
  {
    net::handshake hs{fd, false, net->security()}; // frees its TLS session
    if (net::run_handshake(hs, timeout) != net::handshake::result::admitted)
      // Refused only when it said so (a wrong token); a connection dropped or not answered
      // is worth another try.
      out = hs.status() != net::gate_status::ok
              ? make_error(errc::handshake_refused, where.to_string() + ": " + hs.why())
              : make_error(errc::peer_unreachable, where.to_string() + " did not admit a connection: " + hs.why());
  }
  return out;
}

namespace {
// Why a connection failed, in words (CAF's codes otherwise print as tuples).
bool refused(const caf::error& e) {
  return e == caf::sec::cannot_connect_to_node || describe(e).find(connection_refused) != std::string::npos;
}
std::string connect_failure(const caf::error& e) {
  if (refused(e))
    return connection_refused;
  if (e == caf::sec::request_timeout)
    return "no answer";
  return describe(e);
}
}  // namespace

expected<caf::strong_actor_ptr> connect(caf::actor_system& sys, const endpoint& where,
                                        std::chrono::milliseconds timeout, std::chrono::milliseconds refused_for) {
  using clock = std::chrono::steady_clock;
  const auto began = clock::now();
  auto deadline = began + timeout;
  auto net = network_of(sys);
  if (!net)
    return make_error(errc::invalid_state, "no cluster network is set up in this process "
                                           "(cluster_network::start)");
  caf::scoped_actor self{sys};
  caf::error last;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0)
      break;
    caf::strong_actor_ptr result;
    self->request(net->handle(), left, caf::connect_atom::value, where.host, where.port)
      .receive(
        [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
          result = std::move(ptr);
        },
        [&](caf::error& err) { last = std::move(err); });
    if (result)
      return result;
    // A refused handshake (token, TLS, version) will not change by retrying.
    if (is(last, errc::handshake_refused))
      return last;
    if (!last)
      last = make_error(errc::peer_unreachable, "no actor is published at " + where.to_string());
    if (last == caf::sec::request_timeout)
      break;
    // A port nobody listens on: a client asks a few times, a daemon until its timeout.
    if (refused(last) && refused_for.count() > 0 && clock::now() - began >= refused_for)
      break;
    pause_for(std::chrono::milliseconds(200));
  }
  return make_error(errc::peer_unreachable,
                    "cannot reach the scheduler at " + where.to_string() + " ("
                      + connect_failure(last) + "); is `ashlar node --role scheduler` running there?");
}

expected<std::string> load_token(const std::string& file, const char* env_token) {
  if (!file.empty()) {
    std::ifstream in{file};
    if (!in)
      return make_error(errc::io_error, "cannot read token file " + file);
    std::string line;
    std::getline(in, line);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
      line.pop_back();
    return line;
  }
  return env_token ? std::string{env_token} : std::string{};
}

}  // namespace ashlar::actors
