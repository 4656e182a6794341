// `ashlar status` and `ashlar ctl`: talk to a running cluster's scheduler.
#include <algorithm>
#include <cstdio>

#include "actors/cluster/node.hpp"
#include "actors/cluster/system.hpp"
#include "apps/ashlar/commands.hpp"

namespace ashlar::cli {

namespace {

using namespace std::chrono_literals;

struct client_options {
  std::string join;
  double timeout = 10;
};

// Connects to the cluster at o.join and runs `f` with it. Returns an exit code.
template <class F>
int with_cluster(const client_options& o, const char* who, F f) {
  auto where = actors::parse_endpoint(o.join);
  if (!where) {
    std::fprintf(stderr, "%s: --join: %s\n", who, describe(where.error()).c_str());
    return 2;
  }
  actors::cluster_system_config cfg;
  caf::actor_system sys{cfg};
  auto ptr = actors::connect(sys, *where, std::chrono::milliseconds(static_cast<int64_t>(o.timeout * 1000)));
  if (!ptr) {
    std::fprintf(stderr, "%s: %s\n", who, describe(ptr.error()).c_str());
    return 1;
  }
  caf::scoped_actor self{sys};
  return f(self, caf::actor_cast<actors::cluster_actor>(*ptr));
}

void print_status(const wire::cluster_status& s) {
  std::printf("stage: %s%s%s\n", s.stage.c_str(), s.job.empty() ? "" : ", job: ", s.job.c_str());
  std::printf("\nnodes (%zu):\n  %-4s %-28s %-24s %-6s %s\n", s.nodes.size(), "id", "name", "roles",
              "slots", "state");
  for (const auto& n : s.nodes)
    std::printf("  %-4u %-28s %-24s %-6u %s\n", n.node_id, n.name.c_str(),
                actors::to_string(n.roles).c_str(), n.slots, n.alive ? "alive" : "lost");
  if (!s.stats.workers.empty()) {
    std::vector<double> speeds;
    for (const auto& w : s.stats.workers)
      if (!w.done)
        speeds.push_back(w.samples_per_second);
    std::sort(speeds.begin(), speeds.end());
    std::printf("\nworkers (%zu), %.0f samples in %.1f s, loss %.4f:\n", s.stats.workers.size(),
                static_cast<double>(s.stats.total_samples), s.stats.elapsed_seconds, s.stats.loss);
    if (!speeds.empty())
      std::printf("  speed samples/s: min %.0f, median %.0f, max %.0f\n", speeds.front(),
                  speeds[speeds.size() / 2], speeds.back());
    std::printf("  %-4s %-10s %-10s %-12s %-10s %-10s %s\n", "id", "steps", "samples", "samples/s",
                "step ms", "wait ms", "state");
    for (const auto& w : s.stats.workers)
      std::printf("  %-4u %-10lu %-10lu %-12.0f %-10.2f %-10.2f %s\n", w.worker_id,
                  static_cast<unsigned long>(w.steps), static_cast<unsigned long>(w.samples),
                  w.samples_per_second, w.step_seconds * 1e3, w.wait_seconds * 1e3,
                  w.done ? "left" : "training");
  }
  if (!s.shards.empty()) {
    std::printf("\nshards (%zu):\n  %-4s %-24s %-10s %-10s %s\n", s.shards.size(), "id", "range",
                "version", "dropped", "live workers");
    for (const auto& sh : s.shards) {
      std::string live;
      for (auto w : sh.live_workers)
        live += (live.empty() ? "" : ",") + std::to_string(w);
      std::string range = "[" + std::to_string(sh.begin) + ", " + std::to_string(sh.end) + ")";
      std::printf("  %-4u %-24s %-10lu %-10lu %s\n", sh.shard_id, range.c_str(),
                  static_cast<unsigned long>(sh.version), static_cast<unsigned long>(sh.dropped),
                  live.c_str());
    }
  }
}

}  // namespace

command_fn add_status(CLI::App& app) {
  auto o = std::make_shared<client_options>();
  auto* cmd = app.add_subcommand("status", "Show a cluster's members, speeds, versions and stage");
  cmd->add_option("--join", o->join, "the scheduler's HOST:PORT")->required();
  cmd->add_option("--timeout", o->timeout, "seconds to wait for the scheduler")->capture_default_str();
  return [o] {
    return with_cluster(*o, "ashlar status", [&](caf::scoped_actor& self, const actors::cluster_actor& c) {
      int code = 1;
      self->request(c, 10s, actors::status_atom::value)
        .receive(
          [&](const wire::cluster_status& s) {
            print_status(s);
            code = 0;
          },
          [&](caf::error& err) { std::fprintf(stderr, "ashlar status: %s\n", describe(err).c_str()); });
      return code;
    });
  };
}

command_fn add_ctl(CLI::App& app) {
  auto o = std::make_shared<client_options>();
  auto req = std::make_shared<wire::ctl_request>();
  auto* cmd = app.add_subcommand("ctl", "Change a running cluster: remove or add workers, shut down");
  cmd->require_subcommand(1);
  cmd->add_option("--join", o->join, "the scheduler's HOST:PORT")->required();
  auto* rm = cmd->add_subcommand("remove-worker", "let worker ID finish its step and leave");
  rm->add_option("id", req->worker_id, "worker id (see ashlar status)")->required();
  rm->callback([req] { req->op = wire::ctl_request::remove_worker; });
  auto* add = cmd->add_subcommand("add-worker", "start workers on nodes with free slots");
  add->add_option("--count", req->count, "how many")->default_val(1);
  add->callback([req] { req->op = wire::ctl_request::add_worker; });
  auto* down = cmd->add_subcommand("shutdown", "stop every node of the cluster");
  down->callback([req] { req->op = wire::ctl_request::shutdown; });
  return [o, req] {
    return with_cluster(*o, "ashlar ctl", [&](caf::scoped_actor& self, const actors::cluster_actor& c) {
      int code = 1;
      self->request(c, 15s, *req).receive(
        [&](const std::string& s) {
          std::printf("%s\n", s.c_str());
          code = 0;
        },
        [&](caf::error& err) { std::fprintf(stderr, "ashlar ctl: %s\n", describe(err).c_str()); });
      return code;
    });
  };
}

}  // namespace ashlar::cli
