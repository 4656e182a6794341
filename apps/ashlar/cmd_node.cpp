// `ashlar node`: a node daemon. With the scheduler role it listens for other nodes and
// runs jobs; with server and/or worker roles it joins a scheduler and hosts shards and
// workers when asked. One process may take several roles.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include <unistd.h>

#include <caf/io/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/cluster/cluster.hpp"
#include "actors/cluster/data_plane.hpp"
#include "actors/cluster/embed.hpp"
#include "actors/cluster/node.hpp"
#include "actors/cluster/system.hpp"
#include "apps/ashlar/commands.hpp"
#include "apps/ashlar/security_options.hpp"
#include "apps/ashlar/host.hpp"
#include "apps/ashlar/stop_signal.hpp"
#include "apps/ashlar/train_options.hpp"
#include "runtime/control/node_lifecycle.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/os/subprocess.hpp"
#include "runtime/core/log.hpp"
#include "runtime/metrics/prometheus.hpp"
#include "runtime/net/http_endpoint.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/os/paths.hpp"

namespace ashlar::cli {

namespace {

using namespace std::chrono_literals;

struct node_options {
  std::string roles = "worker";
  std::string listen;
  std::string join;
  uint32_t slots = 1;
  security_options security;
  std::string port_file;
  std::string name;
  std::string data_dir;
  double connect_timeout = 30;
  double wait_timeout = 120;
  double rejoin_timeout = 60;
  bool exit_after_job = false;
  uint32_t protocol = wire::protocol_version;
  std::string data_host;
  int64_t replace_shard = -1;
  std::string work_dir = ".";
  train_options train;
};

std::string default_name() {
  return host_name() + ":" + std::to_string(::getpid());
}

// Runs one job on the cluster's nodes from the main thread; returns the report.
expected<run_report> run_cluster_job(caf::actor_system& sys, const actors::cluster_actor& cluster,
                                     const train_config& cfg, double wait_timeout, http_endpoint* metrics) {
  auto wait_ms = std::chrono::milliseconds(static_cast<int64_t>(wait_timeout * 1000));
  auto stopping = [] { return stop_signal() != 0; };
  if (auto err = actors::wait_for_nodes(sys, cluster, cfg.servers, cfg.workers, wait_ms, stopping))
    return err;
  actors::cluster_placement where{sys, cluster};
  auto hooks = print_hooks(cfg.epochs);
  hooks.metrics = metrics;
  hooks.stop_requested = stopping;
  return actors::run_job(sys, cfg, where, hooks);
}

// A job submitted with `ashlar train --join`: its settings checked (its files only under
// this node's work directory, never over its credentials), then run on the cluster's
// nodes; the answer goes to the cluster actor, which passes it to the submitter.
void run_submitted_job(caf::actor_system& sys, const actors::cluster_actor& cluster, const node_options& o,
                       const wire::job_request& req, const std::vector<std::string>& credential_dirs,
                       const std::vector<std::string>& credential_files, http_endpoint* metrics) {
    train_config cfg;
    caf::error err;
    for (const auto& [k, v] : req.settings)
      if (!err)
        err = apply_setting(cfg, k, v);
    if (!err)
      err = validate(cfg);
    // A submitted job writes only inside this node's work directory.
    for (auto* path : {&cfg.trace, &cfg.metrics, &cfg.checkpoint_dir}) {
      if (err || path->empty())
        continue;
      auto what = path == &cfg.trace ? "run.trace" : path == &cfg.metrics ? "run.metrics" : "run.checkpoint_dir";
      auto inside = confine_path(o.work_dir, *path, what);
      if (!inside) {
        err = inside.error();
        continue;
      }
      // Nor over this node's own credentials, wherever the work directory is.
      bool secret = false;
      for (const auto& d : credential_dirs)
        secret = secret || (!d.empty() && confine_path(d, *inside, what));
      for (const auto& f : credential_files)
        secret = secret || f == *inside;
      if (secret)
        err = make_error(errc::invalid_argument,
                         std::string{what} + " " + *path + " would overwrite this node's credentials");
      *path = *inside;
    }
    if (err) {
      spdlog::warn("scheduler: refused a submitted job: {}", describe(err));
      caf::anon_send(cluster, actors::job_atom::value, err);
      return;
    }
    spdlog::info("scheduler: running a submitted job ({} workers, {} shards, policy {})",
                 cfg.workers, cfg.servers, cfg.policy);
    auto rep = run_cluster_job(sys, cluster, cfg, o.wait_timeout, metrics);
    if (rep)
      caf::anon_send(cluster, actors::job_atom::value, wire::job_result{to_json(*rep)});
    else
      caf::anon_send(cluster, actors::job_atom::value, rep.error());
}

int run_node(node_options& o) {
  auto fail = [](int code, const std::string& msg) {
    std::fprintf(stderr, "ashlar node: %s\n", msg.c_str());
    return code;
  };
  auto roles = actors::parse_roles(o.roles);
  if (!roles)
    return fail(2, describe(roles.error()));
  const bool is_scheduler = actors::has_role(*roles, wire::role::scheduler);
  const bool hosts = actors::has_role(*roles, wire::role::server)
                     || actors::has_role(*roles, wire::role::worker);
  if (is_scheduler && o.listen.empty())
    return fail(2, "the scheduler role needs --listen HOST:PORT (port 0 picks a free one)");
  if (!is_scheduler && o.join.empty())
    return fail(2, "a server or worker node needs --join HOST:PORT (the scheduler's address)");
  if (!is_scheduler && !o.train.config_file.empty())
    return fail(2, "only a scheduler runs a job from CONFIG; submit with `ashlar train CONFIG --join`");
  train_config job_cfg;
  if (auto err = resolve_config(o.train, job_cfg))
    return fail(2, describe(err));
  auto sec = load_security(o.security);
  if (!sec)
    return fail(2, describe(sec.error()));
  if (is_scheduler) {
    auto ep = actors::parse_endpoint(o.listen);
    if (!ep)
      return fail(2, "--listen: " + describe(ep.error()));
    if (auto err = check_listen_policy(ep->host, *sec, o.security.insecure, "the scheduler"))
      return fail(2, describe(err));
  }
  // A server node listens for tensor connections on the address it reaches the scheduler
  // from (or --data-host): the same rule.
  if (actors::has_role(*roles, wire::role::server) && !is_scheduler) {
    auto ep = actors::parse_endpoint(o.join);
    std::string data_host = o.data_host;
    if (data_host.empty() && ep)
      data_host = is_loopback(ep->host) ? ep->host : net::local_address_toward(ep->host, ep->port);
    if (auto err = check_listen_policy(data_host, *sec, o.security.insecure, "this server node's data port"))
      return fail(2, describe(err));
  }
  // Without TLS and without a token, the scheduler makes a token and writes it where the
  // join command it prints says: no one reaches an Ashlar port without credentials.
  if (!o.security.token_file.empty() && sec->token.empty())
    return fail(2, "--token-file " + o.security.token_file + " is empty");
  std::string generated_token_file, reused_token_file;
  const bool generate_token = is_scheduler && sec->token.empty() && !sec->tls;
  if (generate_token) {
    // A scheduler killed on this port left its token: take it up, so its nodes (waiting
    // for it with --rejoin-timeout) join again.
    auto ep = actors::parse_endpoint(o.listen);
    sec->token = ep ? left_token(ep->port, reused_token_file) : std::string{};
    if (sec->token.empty())
      sec->token = make_token();
  }
  if (o.name.empty())
    o.name = default_name();
  if (auto err = init_logging(job_cfg.log_level))
    return fail(2, describe(err));
  // A signal stops a job this node runs (its workers finish their step; the job reports),
  // then the node; the main loop below takes it.
  catch_stop_signals(false);

  actors::cluster_system_config sys_cfg;
  caf::actor_system sys{sys_cfg};
  // Declared after the actor system: its destructor stops it first.
  auto network = actors::cluster_network::start(sys, *sec);
  if (!network)
    return fail(1, describe(network.error()));
  // Tensor connections between this node's shards/workers and other nodes'; stopped (its
  // threads joined) when this function returns, before the actor system goes.
  auto data_plane = std::make_shared<actors::data_plane>(sys);
  struct stop_on_exit {
    std::shared_ptr<actors::data_plane> p;
    ~stop_on_exit() { p->stop(); }
  } data_plane_guard{data_plane};
  caf::scoped_actor self{sys};
  actors::cluster_actor cluster;
  std::unique_ptr<http_endpoint> metrics; // the scheduler's /metrics (run.metrics_listen)
  std::string address;
  int code = 0;

  if (is_scheduler) {
    auto ep = actors::parse_endpoint(o.listen);
    if (!ep)
      return fail(2, "--listen: " + describe(ep.error()));
    actors::cluster_config cc;
    cc.runner = caf::actor_cast<caf::actor>(self);
    cluster = actors::spawn_cluster(sys, cc);
    auto port = (*network)->publish(sys, cluster, *ep);
    if (!port) {
      caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
      return fail(1, describe(port.error()));
    }
    address = ep->host + ":" + std::to_string(*port);
    caf::anon_send(cluster, caf::publish_atom::value, address);
    auto hint = join_hint(o.security);
    if (generate_token) {
      auto file = write_token_file(sec->token, *port);
      if (!file) {
        caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
        return fail(1, describe(file.error()));
      }
      generated_token_file = *file;
      hint += " --token-file " + *file;
    }
    std::printf("ashlar scheduler listening on %s%s\n", address.c_str(), sec->tls ? " (mutual TLS)" : "");
    if (!reused_token_file.empty())
      std::printf("cluster token taken up from %s (left by a scheduler on this port that did not stop "
                  "cleanly; its nodes join again)\n", reused_token_file.c_str());
    else if (!generated_token_file.empty())
      std::printf("cluster token written to %s (readable by this user only)\n", generated_token_file.c_str());
    std::printf("join with: ashlar node --role worker --join %s%s   (or --role server)\n", address.c_str(),
                hint.c_str());
    std::fflush(stdout);
    if (!o.port_file.empty()) {
      std::string tmp = o.port_file + ".tmp";
      std::ofstream{tmp} << *port << "\n";
      std::rename(tmp.c_str(), o.port_file.c_str());
    }
    if (!job_cfg.metrics_listen.empty()) {
      // The scheduler's /metrics outlives its jobs: between jobs it says none runs.
      auto ep = http_endpoint::start(job_cfg.metrics_listen);
      if (!ep)
        return fail(1, describe(ep.error()));
      metrics = std::move(*ep);
      metrics->publish(prometheus_text(job_metrics{}));
      std::printf("Prometheus metrics at %s\n", metrics->url().c_str());
      std::fflush(stdout);
    }
    if (sec->token.empty())
      spdlog::info("no cluster token: nodes are admitted by their TLS certificates alone");
  }

  actors::node_actor node;
  std::shared_ptr<actors::gpu_pool> gpus; // stopped before the actor system ends
  actors::join_options jo;
  if (hosts) {
    jo.name = o.name;
    jo.roles = *roles;
    jo.slots = o.slots;
    jo.data_dir = o.data_dir;
    jo.protocol = o.protocol;
    jo.owner = caf::actor_cast<caf::actor>(self);
    jo.plane = data_plane;
    jo.data_host = o.data_host;
    jo.checkpoint_dir = job_cfg.checkpoint_dir;
    jo.work_dir = o.work_dir;
    jo.replace_shard = o.replace_shard;
    jo.make_backend = host_backend(); // a host process's own (the Python package's), if any
    if (actors::has_role(*roles, wire::role::worker)) {
      // A GPU actor per device (--gpus); a worker takes one while it lasts, else the CPU.
      auto pool = actors::gpu_pool::start(sys, job_cfg.gpus, job_cfg.tf32, job_cfg.gpu_local_model);
      if (!pool)
        return fail(2, describe(pool.error()));
      jo.gpus = gpus = *pool;
      std::string labels;
      for (const auto& g : jo.gpus->labels())
        labels += (labels.empty() ? "" : ", ") + g;
      if (labels.empty())
        spdlog::info("node {}: workers compute on the CPU ({})", o.name, jo.gpus->why_none());
      else
        spdlog::info("node {}: GPUs for its workers: {}", o.name, labels);
    }
    jo.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.connect_timeout * 1000));
    expected<actors::membership> m = caf::error{};
    if (is_scheduler) {
      if (jo.data_host.empty()) {
        auto ep = actors::parse_endpoint(o.listen);
        bool wildcard = ep->host.empty() || ep->host == "0.0.0.0";
        jo.data_host = wildcard ? net::local_address_toward("192.0.2.1", 9) : ep->host;
        if (jo.data_host.empty())
          jo.data_host = "127.0.0.1";
      }
      m = actors::join_cluster(sys, cluster, jo);
    } else {
      auto ep = actors::parse_endpoint(o.join);
      if (!ep)
        return fail(2, "--join: " + describe(ep.error()));
      address = ep->to_string();
      m = actors::join_cluster(sys, *ep, jo);
    }
    if (!m) {
      if (is_scheduler)
        caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
      return fail(1, describe(m.error()));
    }
    node = m->node;
    spdlog::info("node {}: joined the cluster at {} as node {} (roles {})", o.name, address,
                 m->node_id, o.roles);
    if (!is_scheduler) {
      cluster = m->cluster;
      self->monitor(cluster);
    }
  }

  // What a submitted job must never write: the TLS directory, the directory of a token
  // this node made, and a token file it was given.
  std::vector<std::string> credential_dirs, credential_files;
  if (sec->tls)
    credential_dirs.push_back(sec->tls->dir());
  if (!generated_token_file.empty())
    credential_dirs.push_back(std::filesystem::path{generated_token_file}.parent_path().string());
  if (!o.security.token_file.empty())
    credential_files.push_back(std::filesystem::weakly_canonical(o.security.token_file).string());
  bool stop = false;
  if (is_scheduler && !o.train.config_file.empty()) {
    log_rule_notes(job_cfg);
    auto rep = run_cluster_job(sys, cluster, job_cfg, o.wait_timeout, metrics.get());
    code = finish_run(job_cfg, rep, "ashlar node");
    // A job that could not run (its nodes did not come in time, ...) ends the scheduler
    // with the error's exit code, as a finished one does with --exit-after-job.
    if (o.exit_after_job || code != 0)
      stop = true;
  }
  // From here the node's lifecycle decides (runtime/control/node_lifecycle.hpp): this loop
  // turns the scheduler's loss, shutdowns, signals and probe answers into its events, and
  // carries out its actions.
  control::node_timing timing;
  timing.rejoin_ns = static_cast<uint64_t>(std::max(0.0, o.rejoin_timeout) * 1e9);
  timing.settle_ns = static_cast<uint64_t>(
    std::chrono::duration_cast<std::chrono::nanoseconds>(actors::heartbeat_interval + actors::connection_timeout + 500ms)
      .count());
  control::node_lifecycle life{system_clock(), address, timing, !is_scheduler};
  auto ep = actors::parse_endpoint(address);
  auto again = jo;
  again.replace_shard = -1; // a new scheduler places the job's shards itself
  std::function<void(std::vector<control::node_action>)> act = [&](std::vector<control::node_action> actions) {
    for (const auto& a : actions)
      switch (a.kind) {
        case control::node_action::stop_hosted:
          self->request(node, 30s, actors::stop_atom::value)
            .receive([](uint32_t) {},
                     [&](caf::error& err) {
                       spdlog::warn("node {}: its shards and workers did not all stop: {}", o.name, describe(err));
                     });
          break;
        case control::node_action::probe: {
          auto probed = actors::probe_admission(sys, *ep, 1s);
          act(life.on_probe(!probed                                    ? control::node_lifecycle::answer::admitted
                            : is(probed, errc::handshake_refused) ? control::node_lifecycle::answer::refused
                                                                  : control::node_lifecycle::answer::failed,
                            describe(probed)));
          break;
        }
        case control::node_action::rejoin: {
          again.timeout = std::chrono::milliseconds(a.wait_ns / 1000000);
          auto m = actors::rejoin_cluster(sys, *ep, again, node);
          if (m) {
            cluster = m->cluster;
            self->monitor(cluster);
          }
          act(life.on_rejoin(m                                              ? control::node_lifecycle::answer::admitted
                             : is(m.error(), errc::handshake_refused) ? control::node_lifecycle::answer::refused
                                                                      : control::node_lifecycle::answer::failed,
                             m ? "node " + std::to_string(m->node_id) : describe(m.error())));
          break;
        }
        case control::node_action::drain:
          // Workers finish their step and leave; the node reports back with stop_atom.
          if (node)
            self->send(node, wire::ctl_request{wire::ctl_request::shutdown, 0, 0});
          else
            act(life.on_drained());
          break;
        case control::node_action::log_warn:
          spdlog::warn("node {}: {}", o.name, a.text);
          break;
        case control::node_action::log_info:
          spdlog::info("node {}: {}", o.name, a.text);
          break;
        case control::node_action::exit:
          if (!a.text.empty())
            spdlog::error("node {}: {}", o.name, a.text);
          if (a.code != 0)
            code = a.code;
          stop = true;
          break;
      }
  };
  while (!stop) {
    self->receive(
      [&](actors::stop_atom) {
        // The node stopped its workers (a shutdown, or the drain a signal began), or the
        // cluster asked the runner to stop.
        act(life.state() == control::node_lifecycle::phase::draining ? life.on_drained() : life.on_shutdown());
      },
      [&](const wire::job_request& req) {
        run_submitted_job(sys, cluster, o, req, credential_dirs, credential_files, metrics.get());
      },
      [&](caf::down_msg& dm) {
        if (dm.source == cluster.address()) // (not a scheduler this node left for a newer one)
          act(life.on_scheduler_down(to_string(dm.reason)));
      },
      caf::after(100ms) >> [&] {
        if (int sig = take_stop_signal(); sig != 0)
          act(life.on_signal(signal_name(sig)));
        if (!stop)
          act(life.on_time());
      });
  }
  if (is_scheduler && o.exit_after_job) {
    // Tell the nodes the cluster is done (launch stops them too, this is the polite way).
    self->request(cluster, 5s, wire::ctl_request{wire::ctl_request::shutdown, 0, 0})
      .receive([](const std::string&) {}, [](caf::error&) {});
  }
  if (node)
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  if (is_scheduler)
    caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
  if (gpus)
    gpus->stop();
  if (!generated_token_file.empty())
    std::remove(generated_token_file.c_str());
  return code;
}

}  // namespace

command_fn add_node(CLI::App& app) {
  auto o = std::make_shared<node_options>();
  auto* cmd = app.add_subcommand("node", "Run a node daemon: scheduler, server and/or worker");
  cmd->footer("Examples:\n"
              "  ashlar node --role scheduler --listen 0.0.0.0:7400\n"
              "  ashlar node --role server --join HOST:7400\n"
              "  ashlar node --role worker --slots 2 --join HOST:7400\n"
              "  ashlar node --role scheduler --listen 127.0.0.1:0 ops/configs/fmnist-mlp.toml\n"
              "The cluster token comes from --token-file or ASHLAR_TOKEN; nodes with another token\n"
              "or protocol version are refused.");
  cmd->add_option("--role", o->roles, "comma-separated roles: scheduler, server, worker")
    ->capture_default_str();
  cmd->add_option("--listen", o->listen, "scheduler: HOST:PORT to listen on (port 0: any free port)");
  cmd->add_option("--join", o->join, "server/worker: the scheduler's HOST:PORT");
  cmd->add_option("--slots", o->slots, "worker: how many workers this node may host")->capture_default_str();
  add_security_options(cmd, o->security, true);
  cmd->add_option("--port-file", o->port_file, "scheduler: write the port it listens on to FILE");
  cmd->add_option("--name", o->name, "node name in logs (default host:pid)");
  cmd->add_option("--node-data-dir", o->data_dir, "worker: read the data set from here, not the job's data.dir");
  cmd->add_option("--connect-timeout", o->connect_timeout, "seconds to keep trying to reach the scheduler")
    ->capture_default_str();
  cmd->add_option("--wait-timeout", o->wait_timeout, "scheduler: seconds to wait for the job's nodes")
    ->capture_default_str();
  cmd->add_option("--data-host", o->data_host,
                  "address other nodes reach this node's tensor data port at (default: the local "
                  "address on the route to the scheduler)");
  cmd->add_option("--shard", o->replace_shard,
                  "server: serve this shard of the running job again, restored from its checkpoints "
                  "(after its node was lost)");
  cmd->add_option("--work-dir", o->work_dir,
                  "a submitted job's files (run.trace, run.metrics, run.checkpoint_dir) must lie under "
                  "this directory; relative ones are taken from it")
    ->capture_default_str();
  cmd->add_option("--rejoin-timeout", o->rejoin_timeout,
                  "server/worker: seconds to wait for a lost scheduler to come back at the same address "
                  "(e.g. restarted with --resume) and join it again; 0: exit at once")
    ->capture_default_str();
  cmd->add_flag("--exit-after-job", o->exit_after_job, "scheduler: shut the cluster down after CONFIG's job");
  cmd->add_option("--protocol-version", o->protocol, "protocol version to announce (for testing refusals)")
    ->group("");
  add_train_options(cmd, o->train);
  return [o] { return run_node(*o); };
}

}  // namespace ashlar::cli
