// Embedding Ashlar in a host application.
//
// The host has its own actor_system and its own actors; it joins a running Ashlar cluster
// as a worker node, so the scheduler places workers of the running job in this process,
// next to the host's actors. Build target: ashlar-embed-example.
//
//   export ASHLAR_TOKEN=$(head -c 32 /dev/urandom | base64)
//   ashlar node --role scheduler --listen 127.0.0.1:7400 ops/configs/fmnist-mlp.toml
//   ashlar node --role server --join 127.0.0.1:7400
//   ashlar-embed-example 127.0.0.1:7400 [TLS_DIR]
//
// What a host needs: link ashlar_actors, use (or derive from) cluster_system_config so the
// message types and the network layer are set up, start a cluster_network with the
// cluster's token (and TLS credentials, if the cluster uses TLS), then call join_cluster().
#include <cstdio>
#include <cstdlib>

#include "actors/cluster/data_plane.hpp"
#include "actors/cluster/embed.hpp"
#include "actors/cluster/network.hpp"
#include "runtime/core/log.hpp"

using namespace ashlar;

namespace {

// The host application's own configuration: Ashlar's, plus whatever the host needs.
struct host_config : actors::cluster_system_config {
  host_config() {
    // The host's own options and message types go here, e.g.
    // opt_group{custom_options_, "host"}.add(...);
  }
};

// One of the host's own actors: here it just counts the heartbeats the host sends it.
caf::behavior host_monitor(caf::event_based_actor*) {
  auto ticks = std::make_shared<int>(0);
  return {
    [=](actors::step_atom) { ++*ticks; },
    [=](caf::get_atom) { return *ticks; },
  };
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SCHEDULER_HOST:PORT [TLS_DIR]   (the token from $ASHLAR_TOKEN)\n", argv[0]);
    return 2;
  }
  auto where = actors::parse_endpoint(argv[1]);
  if (!where) {
    std::fprintf(stderr, "%s\n", describe(where.error()).c_str());
    return 2;
  }
  if (auto err = init_logging("info", "embedded"))
    return 2;
  net::net_security security;
  security.token = std::getenv("ASHLAR_TOKEN") ? std::getenv("ASHLAR_TOKEN") : "";
  if (argc > 2) {
    auto tls = net::tls_context::load(argv[2]);
    if (!tls) {
      std::fprintf(stderr, "embedded host: %s\n", describe(tls.error()).c_str());
      return 2;
    }
    security.tls = *tls;
  }
  host_config cfg;
  caf::actor_system sys{cfg};
  // Every connection to the cluster is admitted by the token (and TLS). Declared after
  // the actor system, so its destructor stops it first.
  auto network = actors::cluster_network::start(sys, security);
  if (!network) {
    std::fprintf(stderr, "embedded host: %s\n", describe(network.error()).c_str());
    return 1;
  }
  auto monitor = sys.spawn(host_monitor);
  caf::scoped_actor self{sys};

  actors::join_options opts;
  opts.name = "embedded-host";
  opts.owner = caf::actor_cast<caf::actor>(self);
  // Optional: workers here move tensors to and from shards in other processes on direct
  // connections instead of through CAF's middleman. Stop it before the system goes.
  opts.plane = std::make_shared<actors::data_plane>(sys);
  struct stop_plane {
    std::shared_ptr<actors::data_plane> p;
    ~stop_plane() { p->stop(); }
  } plane_guard{opts.plane};
  auto m = actors::join_cluster(sys, *where, opts);
  if (!m) {
    std::fprintf(stderr, "embedded host: %s\n", describe(m.error()).c_str());
    caf::anon_send_exit(monitor, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::printf("embedded host: joined %s as node %u; the scheduler may now run workers here\n",
              argv[1], m->node_id);
  std::fflush(stdout);
  self->monitor(m->cluster);
  int code = 0;
  bool running = true;
  while (running) {
    self->receive(
      [&](actors::stop_atom) { running = false; },            // the cluster shut this node down
      [&](caf::down_msg&) { running = false; },               // the scheduler went away
      caf::after(std::chrono::milliseconds(500)) >> [&] {     // the host keeps doing its own work
        self->send(monitor, actors::step_atom::value);
      });
  }
  self->request(monitor, std::chrono::seconds(5), caf::get_atom::value)
    .receive([&](int ticks) { std::printf("embedded host: done after %d host ticks\n", ticks); },
             [&](caf::error&) { code = 1; });
  caf::anon_send_exit(m->node, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(monitor, caf::exit_reason::user_shutdown);
  return code;
}
