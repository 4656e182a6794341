// `ashlar status` and `ashlar ctl`: talk to a running cluster's scheduler.
#include <algorithm>
#include <cstdio>

#include "actors/cluster/node.hpp"
#include "actors/cluster/system.hpp"
#include "apps/ashlar/commands.hpp"
#include "apps/ashlar/security_options.hpp"

namespace ashlar::cli {

namespace {

using namespace std::chrono_literals;

struct client_options {
  std::string join;
  double timeout = 10;
  security_options security;
  bool all = false; // status: every worker's row
};

// Connects to the cluster at o.join and runs `f` with it. Returns an exit code.
template <class F>
int with_cluster(const client_options& o, const char* who, F f) {
  auto where = actors::parse_endpoint(o.join);
  if (!where) {
    std::fprintf(stderr, "%s: --join: %s\n", who, describe(where.error()).c_str());
    return 2;
  }
  auto sec = load_security(o.security, o.join);
  if (!sec) {
    std::fprintf(stderr, "%s: %s\n", who, describe(sec.error()).c_str());
    return 2;
  }
  actors::cluster_system_config cfg;
  caf::actor_system sys{cfg};
  auto net = actors::cluster_network::start(sys, *sec);
  if (!net) {
    std::fprintf(stderr, "%s: %s\n", who, describe(net.error()).c_str());
    return 1;
  }
  // A dead port is said at once; a scheduler that answers slowly is waited for.
  auto ptr = actors::connect(sys, *where, std::chrono::milliseconds(static_cast<int64_t>(o.timeout * 1000)),
                             std::chrono::milliseconds(1000));
  if (!ptr) {
    std::fprintf(stderr, "%s: %s\n", who, describe(ptr.error()).c_str());
    return 1;
  }
  caf::scoped_actor self{sys};
  return f(self, caf::actor_cast<actors::cluster_actor>(*ptr));
}

// The straggler view: the spread of compute speed (samples per second of computation,
// waits and transfers excluded, so a straggler shows under any policy), the slowest
// workers against the median, and each worker's speed as the profiler predicted it
// against what it then observed.
double compute_speed(const wire::worker_stats& w) {
  return w.compute_per_sample > 0 ? 1.0 / w.compute_per_sample : 0.0;
}

// Rows of the worker table with many workers: this many slowest and as many fastest.
constexpr size_t status_rows = 8;

void print_workers(const wire::cluster_stats& stats, bool all) {
  std::vector<const wire::worker_stats*> live;
  for (const auto& w : stats.workers)
    if (!w.done)
      live.push_back(&w);
  std::sort(live.begin(), live.end(), [](auto* a, auto* b) { return compute_speed(*a) < compute_speed(*b); });
  std::printf("\nworkers (%zu, %zu training), %.0f samples in %.1f s, loss %.4f:\n", stats.workers.size(),
              live.size(), static_cast<double>(stats.total_samples), stats.elapsed_seconds, stats.loss);
  if (!live.empty()) {
    const double median = compute_speed(*live[live.size() / 2]);
    std::printf("  compute speed samples/s: min %.0f, median %.0f, max %.0f\n", compute_speed(*live.front()),
                median, compute_speed(*live.back()));
    std::string slow;
    for (size_t i = 0; i < live.size() && i < 3; ++i) {
      const auto& w = *live[i];
      if (median <= 0 || compute_speed(w) >= 0.8 * median)
        break;
      char buf[128];
      std::snprintf(buf, sizeof(buf), "%sworker %u (%.2fx the median; waits %.0f%% of its step)",
                    slow.empty() ? "" : ", ", w.worker_id, compute_speed(w) / median,
                    w.step_seconds > 0 ? 100 * w.wait_seconds / w.step_seconds : 0.0);
      slow += buf;
    }
    std::printf("  slowest: %s\n", slow.empty() ? "none below 0.8x the median" : slow.c_str());
  }
  std::printf("  %-4s %-8s %-9s %-10s %-8s %-8s %-9s %-9s %-6s %-6s %s\n", "id", "steps", "samples", "samples/s",
              "step ms", "wait ms", "predicted", "observed", "error", "stale", "state");
  // Many workers: the slowest and the fastest rows (by compute speed), unless --all.
  std::vector<const wire::worker_stats*> rows;
  if (all || stats.workers.size() <= 2 * status_rows) {
    for (const auto& w : stats.workers)
      rows.push_back(&w);
  } else {
    for (size_t i = 0; i < live.size(); ++i)
      if (i < status_rows || i + status_rows >= live.size())
        rows.push_back(live[i]);
  }
  for (const auto* wp : rows) {
    const auto& w = *wp;
    std::printf("  %-4u %-8lu %-9lu %-10.0f %-8.2f %-8.2f %-9.0f %-9.0f %-6.2f %-6.1f %s\n", w.worker_id,
                static_cast<unsigned long>(w.steps), static_cast<unsigned long>(w.samples), w.samples_per_second,
                w.step_seconds * 1e3, w.wait_seconds * 1e3, w.predicted_speed, w.observed_speed, w.prediction_error,
                w.staleness, w.done ? "left" : "training");
  }
  if (rows.size() < stats.workers.size())
    std::printf("  (the %zu slowest and %zu fastest of %zu workers by compute speed; --all lists every one)\n",
                status_rows, status_rows, stats.workers.size());
  std::printf("  samples/s: throughput, waits included; predicted / observed: compute samples/s of the\n"
              "  next window as the profiler's GRU predicted it / as measured; error: their mean relative error\n");
}

void print_status(const wire::cluster_status& s, bool all) {
  std::printf("stage: %s%s%s\n", s.stage.c_str(), s.job.empty() ? "" : ", job: ", s.job.c_str());
  std::printf("\nnodes (%zu):\n  %-4s %-28s %-24s %-6s %s\n", s.nodes.size(), "id", "name", "roles",
              "slots", "state");
  for (const auto& n : s.nodes)
    std::printf("  %-4u %-28s %-24s %-6u %s\n", n.node_id, n.name.c_str(),
                actors::to_string(n.roles).c_str(), n.slots, n.alive ? "alive" : "lost");
  if (!s.stats.workers.empty())
    print_workers(s.stats, all);
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
  cmd->add_flag("--all", o->all, "list every worker (with many, the slowest and fastest 8 are listed)");
  add_security_options(cmd, o->security, false);
  return [o] {
    return with_cluster(*o, "ashlar status", [&](caf::scoped_actor& self, const actors::cluster_actor& c) {
      int code = 1;
      self->request(c, 10s, actors::status_atom::value)
        .receive(
          [&](const wire::cluster_status& s) {
            print_status(s, o->all);
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
  auto* cmd = app.add_subcommand("ctl", "Change a running cluster: remove or add workers, stop its job, shut down");
  cmd->require_subcommand(1);
  cmd->add_option("--join", o->join, "the scheduler's HOST:PORT")->required();
  cmd->add_option("--timeout", o->timeout, "seconds to wait for the scheduler")->capture_default_str();
  add_security_options(cmd, o->security, false);
  auto* rm = cmd->add_subcommand("remove-worker", "let worker ID finish its step and leave");
  rm->add_option("id", req->worker_id, "worker id (see ashlar status)")->required();
  rm->callback([req] { req->op = wire::ctl_request::remove_worker; });
  auto* add = cmd->add_subcommand("add-worker", "start workers on nodes with free slots");
  add->add_option("--count", req->count, "how many")->default_val(1);
  add->callback([req] { req->op = wire::ctl_request::add_worker; });
  auto* down = cmd->add_subcommand("shutdown", "stop every node of the cluster");
  down->callback([req] { req->op = wire::ctl_request::shutdown; });
  auto* stop = cmd->add_subcommand("stop-job", "stop the cluster's job (its workers finish their step, it reports); "
                                               "the nodes stay");
  stop->callback([req] { req->op = wire::ctl_request::stop_job; });
  // `--join` goes before or after the subcommand: `ashlar ctl shutdown --join H:P` too.
  for (auto* sub : {rm, add, down, stop})
    sub->fallthrough();
  return [o, req] {
    return with_cluster(*o, "ashlar ctl", [&](caf::scoped_actor& self, const actors::cluster_actor& c) {
      int code = 1;
      // Adding workers waits for the nodes to start them (each loads its data first).
      const auto wait = req->op == wire::ctl_request::add_worker ? std::chrono::seconds(60 + 60 * req->count) : 15s;
      self->request(c, wait, *req).receive(
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
