// `ashlar node`: a node daemon. With the scheduler role it listens for other nodes and
// runs jobs; with server and/or worker roles it joins a scheduler and hosts shards and
// workers when asked. One process may take several roles.
#include <cstdio>
#include <filesystem>
#include <arpa/inet.h>
#include <fstream>
#include <netdb.h>
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
#include "apps/ashlar/launcher_channel.hpp"
#include "apps/ashlar/security_options.hpp"
#include "apps/ashlar/host.hpp"
#include "apps/ashlar/stop_signal.hpp"
#include "apps/ashlar/train_options.hpp"
#include "runtime/policy/policy_rules.hpp"
#include "runtime/os/memory.hpp"
#include "runtime/control/node_lifecycle.hpp"
#include "runtime/control/rendezvous.hpp"
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
  bool oversubscribe = false;
  uint32_t max_job_workers = 4096;
  security_options security;
  std::string port_file;
  std::string job_state_file;
  bool hold_shards = false;
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
  bool launcher_stdin = false;
  train_options train;
};

std::string default_name() {
  return host_name() + ":" + std::to_string(::getpid());
}

// Writes the line `word` to `file` whole, or not at all (written aside, then renamed); nothing
// when `file` is "".
void write_whole(const std::string& file, const std::string& word) {
  if (file.empty())
    return;
  const std::string tmp = file + ".tmp";
  std::ofstream{tmp} << word << "\n";
  std::rename(tmp.c_str(), file.c_str());
}

// Runs one job on the cluster's nodes from the main thread; returns the report. Once the
// job has its nodes, `state_file` (if any) reads "running": a launcher that started them
// knows that a member lost from then on does not fail the start.
expected<run_report> run_cluster_job(caf::actor_system& sys, const actors::cluster_actor& cluster,
                                     const train_config& cfg, double wait_timeout, http_endpoint* metrics,
                                     const std::string& state_file = {}) {
  auto wait_ms = std::chrono::milliseconds(static_cast<int64_t>(wait_timeout * 1000));
  auto stopping = [] { return stop_signal() != 0; };
  if (auto err = actors::wait_for_nodes(sys, cluster, cfg.servers, cfg.workers, wait_ms, stopping))
    return err;
  write_whole(state_file, "running");
  actors::cluster_placement where{sys, cluster};
  auto hooks = print_hooks(script_optimizer(cfg) ? 0 : cfg.epochs);
  hooks.metrics = metrics;
  hooks.stop_requested = stopping;
  return actors::run_job(sys, cfg, where, hooks);
}

// A submitted job's files: only inside this node's work directory, never over its
// credentials; opened beneath it again where they are used (run.confine_root).
caf::error confine_job_files(train_config& cfg, const node_options& o, const std::vector<std::string>& credential_dirs,
                             const std::vector<std::string>& credential_files) {
  for (auto* path : {&cfg.trace, &cfg.metrics, &cfg.checkpoint_dir, &cfg.contention}) {
    if (path->empty())
      continue;
    auto what = path == &cfg.trace     ? "run.trace"
                : path == &cfg.metrics ? "run.metrics"
                : path == &cfg.contention ? "train.contention"
                                          : "run.checkpoint_dir";
    auto inside = confine_path(o.work_dir, *path, what);
    if (!inside)
      return inside.error();
    // Nor over this node's own credentials, wherever the work directory is.
    bool secret = false;
    for (const auto& d : credential_dirs)
      secret = secret || (!d.empty() && confine_path(d, *inside, what));
    for (const auto& f : credential_files)
      secret = secret || f == *inside;
    if (secret)
      return make_error(errc::invalid_argument,
                        std::string{what} + " " + *path + " would overwrite this node's credentials");
    *path = *inside;
  }
  cfg.confine_root = o.work_dir.empty() ? "." : o.work_dir;
  return caf::none;
}

// What a submitted job may make this host do beyond its files: read the data set the
// operator serves (or one under the work directory), listen only where the scheduler
// listens, and hold its model in memory. The report is the submitter's to write.
caf::error check_submitted_job(train_config& cfg, const node_options& o, const train_config& own) {
  cfg.report.clear();
  const uint32_t asked = std::max(cfg.workers, cfg.max_workers);
  if (asked > o.max_job_workers)
    return make_error(errc::invalid_argument, "the job asks for " + std::to_string(asked)
                                                + " workers; this cluster runs at most "
                                                + std::to_string(o.max_job_workers)
                                                + " (ashlar node --role scheduler --max-job-workers)");
  if (cfg.data_dir != own.data_dir && cfg.data_source != data_source_kind::synthetic) {
    auto inside = confine_path(o.work_dir, cfg.data_dir, "data.dir");
    if (!inside)
      return make_error(errc::invalid_argument, "data.dir " + cfg.data_dir + " is not one this scheduler serves: "
                                                  "its own data directory (" + own.data_dir
                                                  + ", ashlar node --data-dir) or one under its --work-dir");
    cfg.data_dir = *inside;
  }
  if (!cfg.metrics_listen.empty() && cfg.metrics_listen != own.metrics_listen) {
    auto ep = actors::parse_endpoint(cfg.metrics_listen);
    auto mine = actors::parse_endpoint(o.listen);
    const bool same_host = ep && mine && (ep->host == mine->host || (is_loopback(ep->host) && is_loopback(mine->host)));
    if (!same_host)
      return make_error(errc::invalid_argument,
                        "run.metrics_listen " + cfg.metrics_listen + ": a submitted job may listen only on the "
                          + "scheduler's own address (" + (mine ? mine->host : o.listen)
                          + "); the operator serves /metrics with `ashlar node --metrics-listen`");
  }
  // The scheduler's process holds the job driver's copies of the parameters (the first,
  // the divergence guard's snapshot, an evaluation's, the final): a model this host
  // cannot hold is refused before anything is allocated, as a local run refuses it.
  if (auto big = check_model_memory(cfg.model.num_params(), 4, available_memory_bytes(), cfg.model.to_string()))
    return located(big, "the scheduler's host");
  return caf::none;
}

// A job submitted with `ashlar train --join`: its settings checked, then run on the
// cluster's nodes; the answer goes to the cluster actor, which passes it to the submitter.
void run_submitted_job(caf::actor_system& sys, const actors::cluster_actor& cluster, const node_options& o,
                       const train_config& own, const wire::job_request& req,
                       const std::vector<std::string>& credential_dirs,
                       const std::vector<std::string>& credential_files, http_endpoint* metrics) {
    train_config cfg;
    caf::error err;
    for (const auto& [k, v] : req.settings)
      if (!err)
        err = apply_setting(cfg, k, v);
    if (!err)
      err = validate_job(cfg);
    if (!err)
      err = confine_job_files(cfg, o, credential_dirs, credential_files);
    if (!err)
      err = check_submitted_job(cfg, o, own);
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

// What a node is, from its options: checked before anything starts.
struct node_setup {
  std::vector<wire::role> roles;
  bool is_scheduler = false;
  bool hosts = false; // server and/or worker
  net::net_security sec;
  train_config job_cfg;
  bool generate_token = false;
  std::string reused_token_file;
};

// Prints why the node cannot run; returns the exit code.
int node_failed(int code, const std::string& msg) {
  std::fprintf(stderr, "ashlar node: %s\n", msg.c_str());
  return code;
}

// The roles and the addresses they need: an error's text, or nothing.
std::optional<std::string> check_roles(const node_options& o, node_setup& s) {
  auto roles = actors::parse_roles(o.roles);
  if (!roles)
    return describe(roles.error());
  s.roles = *roles;
  s.is_scheduler = actors::has_role(s.roles, wire::role::scheduler);
  s.hosts = actors::has_role(s.roles, wire::role::server) || actors::has_role(s.roles, wire::role::worker);
  if (s.is_scheduler && o.listen.empty())
    return "the scheduler role needs --listen HOST:PORT (port 0 picks a free one)";
  if (!s.is_scheduler && o.join.empty())
    return "a server or worker node needs --join HOST:PORT (the scheduler's address)";
  if (!s.is_scheduler && !o.train.config_file.empty())
    return "only a scheduler runs a job from CONFIG; submit with `ashlar train CONFIG --join`";
  if (actors::has_role(s.roles, wire::role::worker) && !o.oversubscribe) {
    const unsigned cores = std::thread::hardware_concurrency();
    const uint32_t limit = host_slot_limit(cores, available_memory_bytes());
    if (o.slots > limit)
      return "--slots " + std::to_string(o.slots) + ": this host offers at most " + std::to_string(limit)
             + " worker slots (64 per core on its " + std::to_string(cores)
             + " cores, one per 32 MiB of available memory); say --oversubscribe to offer more";
  }
  return std::nullopt;
}

// Where the node listens (the scheduler's port, a server node's data port) is allowed by
// its credentials: an error's text, or nothing.
std::optional<std::string> check_listening(const node_options& o, const node_setup& s) {
  if (s.is_scheduler) {
    auto ep = actors::parse_endpoint(o.listen);
    if (!ep)
      return "--listen: " + describe(ep.error());
    if (auto err = check_listen_policy(ep->host, s.sec, o.security.insecure, "the scheduler"))
      return describe(err);
  }
  // A server node listens for tensor connections on the address it reaches the scheduler
  // from (or --data-host): the same rule.
  if (actors::has_role(s.roles, wire::role::server) && !s.is_scheduler) {
    auto ep = actors::parse_endpoint(o.join);
    std::string data_host = o.data_host;
    if (data_host.empty() && ep)
      data_host = is_loopback(ep->host) ? ep->host : net::local_address_toward(ep->host, ep->port);
    if (auto err = check_listen_policy(data_host, s.sec, o.security.insecure, "this server node's data port"))
      return describe(err);
  }
  return std::nullopt;
}

// Checks the options and loads the credentials: -1 when the node can start, else its exit code.
// The addresses `host` resolves to, as text ("10.0.0.5", "::1"); none if it does not resolve
// (the join then fails naming it).
std::vector<std::string> addresses_of(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0)
    return out;
  for (auto* a = res; a; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* at = a->ai_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (::inet_ntop(a->ai_family, at, text, sizeof(text)))
      out.emplace_back(text);
  }
  ::freeaddrinfo(res);
  return out;
}

// --join auto and --listen auto: the scheduler's address from the workload manager's
// variables (runtime/control/rendezvous.hpp: Slurm's node lists, the Kubernetes operators'
// MASTER_ADDR, ASHLAR_JOIN). A job of several hosts is refused a scheduler on loopback.
// Returns -1 when all is set, else the exit code.
int resolve_auto_addresses(node_options& o) {
  if (o.join != "auto" && o.listen != "auto")
    return -1;
  auto r = control::rendezvous_from_env([](const char* name) -> const char* { return std::getenv(name); });
  if (!r)
    return node_failed(2, describe(r.error()));
  if (o.listen == "auto") {
    o.listen = "0.0.0.0:" + std::to_string(r->port);
    std::printf("listening on %s (--listen auto: the port from %s's rule, the scheduler's host %s from %s)\n",
                o.listen.c_str(), r->manager.c_str(), r->host.c_str(), r->source.c_str());
  }
  if (o.join == "auto") {
    if (auto err = control::check_not_loopback(*r, addresses_of(r->host)))
      return node_failed(2, "--join auto: " + describe(err));
    o.join = r->address();
    std::printf("joining the scheduler at %s (--join auto: %s, from %s)\n", o.join.c_str(), r->manager.c_str(),
                r->source.c_str());
  }
  std::fflush(stdout);
  return -1;
}

int prepare_node(node_options& o, node_setup& s) {
  if (int rc = resolve_auto_addresses(o); rc >= 0)
    return rc;
  if (auto why = check_roles(o, s))
    return node_failed(2, *why);
  if (auto err = resolve_config(o.train, s.job_cfg))
    return node_failed(2, describe(err));
  auto sec = load_security(o.security, o.join);
  if (!sec)
    return node_failed(2, describe(sec.error()));
  s.sec = std::move(*sec);
  if (auto why = check_listening(o, s))
    return node_failed(2, *why);
  // Without TLS and without a token, the scheduler makes a token and writes it where the
  // join command it prints says: no one reaches an Ashlar port without credentials.
  if (!o.security.token_file.empty() && s.sec.token.empty())
    return node_failed(2, "--token-file " + o.security.token_file + " is empty");
  s.generate_token = s.is_scheduler && s.sec.token.empty() && !s.sec.tls;
  if (s.generate_token) {
    // A scheduler killed on this port left its token: take it up, so its nodes (waiting
    // for it with --rejoin-timeout) join again.
    auto ep = actors::parse_endpoint(o.listen);
    s.sec.token = ep ? left_token(ep->port, s.reused_token_file) : std::string{};
    if (s.sec.token.empty())
      s.sec.token = make_token();
    // Where the token will be written: refused now, before listening, if others could read it.
    if (auto dir = private_token_dir(); !dir)
      return node_failed(2, describe(dir.error()));
  }
  if (o.name.empty())
    o.name = default_name();
  if (auto err = init_logging(s.job_cfg.log_level))
    return node_failed(2, describe(err));
  return -1;
}

// A running node process: the scheduler it is or joined, the node actor hosting its
// shards and workers, and the lifecycle that decides what happens when either is lost.
class node_process {
public:
  node_process(node_options& o, node_setup& s, caf::actor_system& sys, std::shared_ptr<actors::data_plane> plane)
      : o_(o), s_(s), sys_(sys), plane_(std::move(plane)), self_(sys) {}

  // The scheduler role: the cluster actor, published; the join command printed. -1 or an exit code.
  int start_scheduler(actors::cluster_network& network) {
    auto ep = actors::parse_endpoint(o_.listen);
    if (!ep)
      return node_failed(2, "--listen: " + describe(ep.error()));
    actors::cluster_config cc;
    cc.runner = caf::actor_cast<caf::actor>(self_);
    cluster_ = actors::spawn_cluster(sys_, cc);
    auto port = network.publish(sys_, cluster_, *ep);
    if (!port)
      return node_failed(1, describe(port.error()));
    address_ = ep->host + ":" + std::to_string(*port);
    caf::anon_send(cluster_, caf::publish_atom::value, address_);
    auto hint = join_hint(o_.security);
    if (s_.generate_token) {
      auto file = write_token_file(s_.sec.token, *port);
      if (!file)
        return node_failed(1, describe(file.error()));
      generated_token_file_ = *file;
      hint += " --token-file " + *file;
    }
    announce(hint);
    write_whole(o_.port_file, std::to_string(*port));
    if (!s_.job_cfg.metrics_listen.empty()) {
      // The scheduler's /metrics outlives its jobs: between jobs it says none runs.
      auto metrics = http_endpoint::start(s_.job_cfg.metrics_listen);
      if (!metrics)
        return node_failed(1, describe(metrics.error()));
      metrics_ = std::move(*metrics);
      metrics_->publish(prometheus_text(job_metrics{}));
      std::printf("Prometheus metrics at %s\n", metrics_->url().c_str());
      std::fflush(stdout);
    }
    if (s_.sec.token.empty())
      spdlog::info("no cluster token: nodes are admitted by their TLS certificates alone");
    return -1;
  }

  // The server and worker roles: joins the cluster (its own, for a scheduler). -1 or an exit code.
  int join() {
    if (int rc = make_join_options(); rc >= 0)
      return rc;
    expected<actors::membership> m = caf::error{};
    if (s_.is_scheduler) {
      m = actors::join_cluster(sys_, cluster_, jo_);
    } else {
      auto ep = actors::parse_endpoint(o_.join);
      if (!ep)
        return node_failed(2, "--join: " + describe(ep.error()));
      address_ = ep->to_string();
      m = actors::join_cluster(sys_, *ep, jo_);
    }
    if (!m)
      return node_failed(1, describe(m.error()));
    node_ = m->node;
    spdlog::info("node {}: joined the cluster at {} as node {} (roles {})", o_.name, address_, m->node_id, o_.roles);
    if (!s_.is_scheduler) {
      cluster_ = m->cluster;
      self_->monitor(cluster_);
    }
    return -1;
  }

  // A scheduler given CONFIG runs that job first; it ends the node with --exit-after-job
  // or when the job could not run (its nodes did not come in time, ...).
  void run_config_job() {
    if (!s_.is_scheduler || o_.train.config_file.empty())
      return;
    log_rule_notes(s_.job_cfg);
    auto rep = run_cluster_job(sys_, cluster_, s_.job_cfg, o_.wait_timeout, metrics_.get(), o_.job_state_file);
    code_ = finish_run(s_.job_cfg, rep, "ashlar node");
    if (o_.exit_after_job || code_ != 0)
      stop_ = true;
  }

  // From here the node's lifecycle decides (runtime/control/node_lifecycle.hpp): this loop
  // turns the scheduler's loss, shutdowns, signals and probe answers into its events.
  void serve() {
    control::node_lifecycle life{system_clock(), address_, node_timing(), !s_.is_scheduler};
    life_ = &life;
    auto credentials = credential_paths();
    while (!stop_) {
      self_->receive(
        [&](actors::stop_atom) {
          // The node stopped its workers (a shutdown, or the drain a signal began), or the
          // cluster asked the runner to stop.
          act(life.state() == control::node_lifecycle::phase::draining ? life.on_drained() : life.on_shutdown());
        },
        [&](const wire::job_request& req) {
          run_submitted_job(sys_, cluster_, o_, s_.job_cfg, req, credentials.first, credentials.second,
                            metrics_.get());
        },
        [&](caf::down_msg& dm) {
          if (dm.source == cluster_.address()) // (not a scheduler this node left for a newer one)
            act(life.on_scheduler_down(to_string(dm.reason)));
        },
        caf::after(100ms) >> [&] {
          if (int sig = take_stop_signal(); sig != 0)
            act(life.on_signal(signal_name(sig), o_.hold_shards && shards_hosted_->load() > 0));
          if (!stop_)
            act(life.on_time());
        });
    }
    life_ = nullptr;
  }

  // Tells the nodes the cluster is done (--exit-after-job), stops what this process runs;
  // returns the exit code.
  int shut_down() {
    if (s_.is_scheduler && o_.exit_after_job) // launch stops them too, this is the polite way
      self_->request(cluster_, 5s, wire::ctl_request{wire::ctl_request::shutdown, 0, 0})
        .receive([](const std::string&) {}, [](caf::error&) {});
    return code_;
  }

  ~node_process() {
    if (node_)
      caf::anon_send_exit(node_, caf::exit_reason::user_shutdown);
    if (cluster_ && s_.is_scheduler)
      caf::anon_send_exit(cluster_, caf::exit_reason::user_shutdown);
    if (gpus_)
      gpus_->stop();
    if (!generated_token_file_.empty())
      std::remove(generated_token_file_.c_str());
  }

private:
  // Prints the scheduler's address, where its token is, and the command that joins it.
  void announce(const std::string& hint) {
    std::printf("ashlar scheduler listening on %s%s\n", address_.c_str(), s_.sec.tls ? " (mutual TLS)" : "");
    if (!s_.reused_token_file.empty())
      std::printf("cluster token taken up from %s (left by a scheduler on this port that did not stop "
                  "cleanly; its nodes join again)\n", s_.reused_token_file.c_str());
    else if (!generated_token_file_.empty())
      std::printf("cluster token written to %s (readable by this user only)\n", generated_token_file_.c_str());
    std::printf("join with: ashlar node --role worker --join %s%s   (or --role server)\n", address_.c_str(),
                hint.c_str());
    std::fflush(stdout);
  }

  // What the node offers when it joins: roles, slots, its data plane, its GPUs. -1 or an exit code.
  int make_join_options() {
    jo_.name = o_.name;
    jo_.roles = s_.roles;
    jo_.slots = o_.slots;
    jo_.data_dir = o_.data_dir;
    jo_.protocol = o_.protocol;
    jo_.owner = caf::actor_cast<caf::actor>(self_);
    jo_.plane = plane_;
    jo_.data_host = o_.data_host;
    jo_.checkpoint_dir = s_.job_cfg.checkpoint_dir;
    jo_.work_dir = o_.work_dir;
    jo_.shards_hosted = shards_hosted_;
    jo_.replace_shard = o_.replace_shard;
    jo_.make_backend = host_backend(); // a host process's own (the Python package's), if any
    jo_.timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.connect_timeout * 1000));
    if (actors::has_role(s_.roles, wire::role::worker)) {
      // A GPU actor per device (--gpus); a worker takes one while it lasts, else the CPU.
      auto pool = actors::gpu_pool::start(sys_, s_.job_cfg.gpus, s_.job_cfg.tf32, s_.job_cfg.gpu_local_model);
      if (!pool)
        return node_failed(2, describe(pool.error()));
      jo_.gpus = gpus_ = *pool;
      std::string labels;
      for (const auto& g : jo_.gpus->labels())
        labels += (labels.empty() ? "" : ", ") + g;
      if (labels.empty())
        spdlog::info("node {}: workers compute on the CPU ({})", o_.name, jo_.gpus->why_none());
      else
        spdlog::info("node {}: GPUs for its workers: {}", o_.name, labels);
    }
    if (s_.is_scheduler && jo_.data_host.empty()) {
      auto ep = actors::parse_endpoint(o_.listen);
      bool wildcard = ep->host.empty() || ep->host == "0.0.0.0";
      jo_.data_host = wildcard ? net::local_address_toward("192.0.2.1", 9) : ep->host;
      if (jo_.data_host.empty())
        jo_.data_host = "127.0.0.1";
    }
    return -1;
  }

  // What a submitted job must never write: the TLS directory, the directory of a token
  // this node made, and a token file it was given (directories, files).
  std::pair<std::vector<std::string>, std::vector<std::string>> credential_paths() const {
    std::vector<std::string> dirs, files;
    if (s_.sec.tls)
      dirs.push_back(s_.sec.tls->dir());
    if (!generated_token_file_.empty())
      dirs.push_back(std::filesystem::path{generated_token_file_}.parent_path().string());
    if (!o_.security.token_file.empty())
      files.push_back(std::filesystem::weakly_canonical(o_.security.token_file).string());
    return {dirs, files};
  }

  control::node_timing node_timing() const {
    control::node_timing timing;
    timing.rejoin_ns = static_cast<uint64_t>(std::max(0.0, o_.rejoin_timeout) * 1e9);
    timing.settle_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(actors::heartbeat_interval + actors::connection_timeout
                                                           + 500ms)
        .count());
    return timing;
  }

  // Carries out the lifecycle's actions; answers (a probe's, a rejoin's) go back to it.
  void act(std::vector<control::node_action> actions) {
    for (const auto& a : actions)
      switch (a.kind) {
        case control::node_action::stop_hosted:
          self_->request(node_, 30s, actors::stop_atom::value)
            .receive([](uint32_t) {},
                     [&](caf::error& err) {
                       spdlog::warn("node {}: its shards and workers did not all stop: {}", o_.name, describe(err));
                     });
          break;
        case control::node_action::probe:
          probe();
          break;
        case control::node_action::rejoin:
          rejoin(a.wait_ns);
          break;
        case control::node_action::drain:
          // Workers finish their step and leave; the node reports back with stop_atom.
          if (node_)
            self_->send(node_, wire::ctl_request{wire::ctl_request::shutdown, 0, 0});
          else
            act(life_->on_drained());
          break;
        case control::node_action::log_warn:
          spdlog::warn("node {}: {}", o_.name, a.text);
          break;
        case control::node_action::log_info:
          spdlog::info("node {}: {}", o_.name, a.text);
          break;
        case control::node_action::exit:
          if (!a.text.empty())
            spdlog::error("node {}: {}", o_.name, a.text);
          if (a.code != 0)
            code_ = a.code;
          stop_ = true;
          break;
      }
  }

  static control::node_lifecycle::answer answer_of(const caf::error& err) {
    return !err                                  ? control::node_lifecycle::answer::admitted
           : is(err, errc::handshake_refused) ? control::node_lifecycle::answer::refused
                                                : control::node_lifecycle::answer::failed;
  }

  // Whether the scheduler at this node's address admits it again.
  void probe() {
    auto probed = actors::probe_admission(sys_, *actors::parse_endpoint(address_), 1s);
    act(life_->on_probe(answer_of(probed), describe(probed)));
  }

  // Joins the scheduler at this node's address again, as the same node process.
  void rejoin(uint64_t wait_ns) {
    auto again = jo_;
    again.replace_shard = -1; // a new scheduler places the job's shards itself
    again.timeout = std::chrono::milliseconds(wait_ns / 1000000);
    auto m = actors::rejoin_cluster(sys_, *actors::parse_endpoint(address_), again, node_);
    if (m) {
      cluster_ = m->cluster;
      self_->monitor(cluster_);
    }
    act(life_->on_rejoin(answer_of(m ? caf::error{} : m.error()),
                         m ? "node " + std::to_string(m->node_id) : describe(m.error())));
  }

  node_options& o_;
  node_setup& s_;
  caf::actor_system& sys_;
  std::shared_ptr<actors::data_plane> plane_;
  std::shared_ptr<std::atomic<uint32_t>> shards_hosted_ = std::make_shared<std::atomic<uint32_t>>(0);
  caf::scoped_actor self_;
  actors::cluster_actor cluster_;
  actors::node_actor node_;
  std::shared_ptr<actors::gpu_pool> gpus_; // stopped before the actor system ends
  std::unique_ptr<http_endpoint> metrics_; // the scheduler's /metrics (run.metrics_listen)
  actors::join_options jo_;
  std::string address_;
  std::string generated_token_file_;
  control::node_lifecycle* life_ = nullptr; // while serve() runs
  int code_ = 0;
  bool stop_ = false;
};

int run_node(node_options& o) {
  // Started by `ashlar launch --hosts`: the credentials come over ssh's stdin.
  std::unique_ptr<launcher_channel> channel;
  if (o.launcher_stdin) {
    auto opened = open_launcher_channel(o.security);
    if (!opened)
      return node_failed(2, describe(opened.error()));
    channel = std::move(*opened);
  }
  node_setup s;
  if (int rc = prepare_node(o, s); rc >= 0)
    return rc;
  // The launcher's credentials are loaded (the token and the TLS context are in memory):
  // their files go now, so that even a node killed later leaves none behind.
  channel.reset();
  // A signal stops a job this node runs (its workers finish their step; the job reports),
  // then the node; node_process::serve takes it.
  catch_stop_signals(false);
  actors::cluster_system_config sys_cfg;
  caf::actor_system sys{sys_cfg};
  // Declared after the actor system: its destructor stops it first.
  auto network = actors::cluster_network::start(sys, s.sec);
  if (!network)
    return node_failed(1, describe(network.error()));
  // Tensor connections between this node's shards/workers and other nodes'; stopped (its
  // threads joined) when this function returns, before the actor system goes.
  auto data_plane = std::make_shared<actors::data_plane>(sys);
  struct stop_on_exit {
    std::shared_ptr<actors::data_plane> p;
    ~stop_on_exit() { p->stop(); }
  } data_plane_guard{data_plane};
  node_process node{o, s, sys, data_plane};
  if (s.is_scheduler)
    if (int rc = node.start_scheduler(**network); rc >= 0)
      return rc;
  if (s.hosts)
    if (int rc = node.join(); rc >= 0)
      return rc;
  node.run_config_job();
  node.serve();
  return node.shut_down();
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
  cmd->add_option("--listen", o->listen,
                  "scheduler: HOST:PORT to listen on (port 0: any free port); auto: 0.0.0.0 and the port of --join "
                  "auto's rule");
  cmd->add_option("--join", o->join,
                  "server/worker: the scheduler's HOST:PORT; auto: from ASHLAR_JOIN, Slurm's node lists (the first "
                  "host of the first component) or MASTER_ADDR/MASTER_PORT (PET_*), never loopback for a job of "
                  "several hosts");
  cmd->add_option("--slots", o->slots, "worker: how many workers this node may host")->capture_default_str();
  cmd->add_flag("--oversubscribe", o->oversubscribe,
                "worker: offer more slots than this host's cores and memory allow (64 per core, one per "
                "32 MiB available)");
  cmd->add_option("--max-job-workers", o->max_job_workers,
                  "scheduler: refuse a submitted job asking for more workers (train.workers, train.max_workers)")
    ->capture_default_str();
  add_security_options(cmd, o->security, true);
  cmd->add_option("--port-file", o->port_file, "scheduler: write the port it listens on to FILE");
  cmd->add_flag("--hold-shards-on-signal", o->hold_shards,
                "server: on SIGTERM/SIGINT, keep serving the running job's shards until the scheduler ends the job "
                "(at most 30 s), for a workload manager that signals every process at once (Slurm's scancel); "
                "without it the node checkpoints its shards and leaves (a replacement restores them)");
  cmd->add_option("--job-state-file", o->job_state_file,
                  "scheduler: write 'running' to FILE once CONFIG's job has its nodes (for a launcher)");
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
  cmd->add_flag("--launcher-stdin", o->launcher_stdin,
                "server/worker: read the cluster token and TLS files from stdin, then stop when it says or ends "
                "(how `ashlar launch --hosts` starts nodes over ssh)");
  cmd->add_flag("--exit-after-job", o->exit_after_job, "scheduler: shut the cluster down after CONFIG's job");
  cmd->add_option("--protocol-version", o->protocol, "protocol version to announce (for testing refusals)")
    ->group("");
  add_train_options(cmd, o->train);
  return [o] { return run_node(*o); };
}

}  // namespace ashlar::cli
