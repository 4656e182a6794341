// `ashlar launch --hosts h1:4,h2:2` / `--hostfile FILE`: the nodes on other hosts over ssh,
// as horovodrun starts its ranks (runtime/control/host_plan.hpp places them;
// runtime/os/remote_start.hpp is the channel each node reads its credentials and signals on).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

#include "apps/ashlar/launcher.hpp"
#include "actors/cluster/system.hpp"
#include "runtime/control/rendezvous.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/net/tls.hpp"
#include "runtime/policy/policy_rules.hpp"

namespace ashlar::cli {

// --hosts/--hostfile: reads the hosts, places the nodes on them, and sets the job's workers
// and servers to what was placed. Returns the exit code, 0 when the plan holds.
int launcher::plan_hosts() {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "ashlar launch: %s\n", why.c_str());
    return 2;
  };
  if (!o.python.empty())
    return fail("--python with --hosts: worker scripts on other hosts are not supported yet (their collectives' "
                "store is a directory of this host); run the scripts on one host, or the job's nodes with a CONFIG");
  if (!o.hosts.empty() && !o.hostfile.empty())
    return fail("give --hosts or --hostfile, not both");
  expected<std::vector<control::host_slots>> list = std::vector<control::host_slots>{};
  if (!o.hosts.empty()) {
    list = control::parse_host_list(o.hosts);
  } else {
    std::ifstream in{o.hostfile};
    if (!in)
      return fail("cannot read the hostfile " + o.hostfile);
    std::string text{std::istreambuf_iterator<char>{in}, {}};
    list = control::parse_hostfile(text, o.hostfile);
  }
  if (!list)
    return fail(describe(list.error()));
  train_config first;
  if (auto err = resolve_config(train, first))
    return fail(describe(err));
  // The slots are the workers, unless the command line or the environment asks for a number
  // (--workers, --set train.workers, ASHLAR_TRAIN_WORKERS: filled in host order); a
  // CONFIG's train.workers gives way to the hosts' slots, as the launch says.
  const bool asked = user_set(first, "train.workers");
  auto placed = control::plan_hosts(*list, asked ? first.workers : 0, first.servers);
  if (!placed)
    return fail(describe(placed.error()));
  hosts = *placed;
  if (!asked && first.workers != hosts.workers && first.sources.count("train.workers"))
    std::printf("[launch] train.workers %u (%s) gives way to the hosts' %u slots (--workers N to use fewer)\n",
                first.workers, first.sources.at("train.workers").c_str(), hosts.workers);
  // Last on the scheduler's command line, so that nothing after it changes them.
  train.sets.push_back("train.workers=" + std::to_string(hosts.workers));
  train.sets.push_back("train.servers=" + std::to_string(hosts.servers));
  return 0;
}

// --hosts beyond loopback: the hosts reach the scheduler at this host's address on the route
// to the first of them (or --scheduler-address), never loopback. Returns the exit code, 0
// once it is set.
int launcher::pick_scheduler_address() {
  if (hosts.loopback_only)
    return 0;
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "ashlar launch: %s\n", why.c_str());
    return 2;
  };
  sched_host = o.scheduler_address;
  std::string toward;
  for (const auto& n : hosts.nodes)
    if (toward.empty() && !control::is_loopback_host(n.host))
      toward = n.host;
  if (toward.find(':') != std::string::npos || sched_host.find(':') != std::string::npos)
    return fail("the hosts beyond this one are named by IPv6 address (" + toward + ", or --scheduler-address "
                + sched_host + "): launch --hosts reaches them over IPv4 only; name them by host name or IPv4 address");
  if (sched_host.empty())
    sched_host = net::local_address_toward(toward, o.ssh.port ? o.ssh.port : 22);
  if (sched_host.empty() || control::is_loopback_address(sched_host))
    return fail("the job spans hosts beyond this one (" + toward + "), but this host's address toward it is '"
                + sched_host + "' (" + (o.scheduler_address.empty() ? "the route's" : "--scheduler-address")
                + "): every host would look for the scheduler on itself. Say --scheduler-address ADDRESS, an "
                  "address of this host the others reach");
  return 0;
}

// A CA and one certificate of this launch's own, for the nodes' mutual TLS (the scheduler
// listens beyond loopback). Returns the exit code, 0 once they are made.
int launcher::make_tls() {
  tls_dir = dir + "/tls";
  auto made = net::ensure_ca(dir + "/ca");
  caf::error err = made ? net::issue_node_cert(dir + "/ca", tls_dir, "ashlar-launch", 30) : made.error();
  if (err) {
    std::fprintf(stderr, "ashlar launch: cannot make this launch's TLS credentials: %s\n", describe(err).c_str());
    return 1;
  }
  return 0;
}

// Tries ssh to every host at once (BatchMode, `true`), as horovodrun does before it starts:
// returns the exit code, 0 when every host answered; otherwise names each one that did not,
// with what ssh said.
int launcher::check_hosts() {
  std::vector<std::string> names;
  for (const auto& n : hosts.nodes)
    if (std::find(names.begin(), names.end(), n.host) == names.end())
      names.push_back(n.host);
  std::printf("[launch] checking ssh to %zu host(s): %s\n", names.size(), hosts.describe().c_str());
  std::fflush(stdout);
  std::vector<child> probes;
  for (const auto& h : names) {
    auto p = subprocess::start(ssh_argv(o.ssh, h, "true"), "", true);
    if (!p) {
      std::fprintf(stderr, "ashlar launch: %s\n", describe(p.error()).c_str());
      return 1;
    }
    p->close_input();
    probes.push_back(child{h, std::move(*p), "", true, false, "", false, -1, false, 1});
  }
  const auto deadline = steady_now() + std::chrono::duration<double>(o.ssh.connect_timeout_s + 20);
  std::string failed;
  for (auto& c : probes) {
    int code = -1;
    while (!c.proc.poll_exit(code) && steady_now() < deadline)
      pause_for(std::chrono::milliseconds(20));
    std::string said;
    char buf[4096];
    ssize_t n;
    if (code < 0)
      c.proc.signal(SIGKILL);
    // What it said, without waiting: another process (an ssh master) may hold the pipe open.
    ::fcntl(c.proc.output_fd(), F_SETFL, ::fcntl(c.proc.output_fd(), F_GETFL) | O_NONBLOCK);
    while (code >= 0 && (n = ::read(c.proc.output_fd(), buf, sizeof(buf))) > 0)
      said.append(buf, static_cast<size_t>(n));
    while (!said.empty() && (said.back() == '\n' || said.back() == '\r'))
      said.pop_back();
    if (const auto nl = said.find_last_of('\n'); nl != std::string::npos)
      said = said.substr(nl + 1);
    if (code != 0)
      failed += "\n  " + c.prefix + ": " + (code < 0 ? "no answer within the connect timeout" : said.empty() ? control::describe_exit(code) : said);
  }
  if (failed.empty())
    return 0;
  std::fprintf(stderr, "ashlar launch: cannot reach these hosts over ssh (BatchMode: a key, no password):%s\n",
               failed.c_str());
  return 1;
}

// Starts every placed node on its host over ssh, its credentials sent on the channel;
// false (every process killed) when one cannot start.
bool launcher::start_host_nodes() {
  std::printf("[launch] scheduler at %s; starting %u server and %u worker node(s) over ssh: %s\n", join.c_str(),
              hosts.servers, static_cast<unsigned>(hosts.nodes.size() - hosts.servers), hosts.describe().c_str());
  std::printf("[launch] %s\n", plan.c_str());
  std::fflush(stdout);
  launch_credentials creds;
  // The token as every node reads it (the launch's file, the user's, or $ASHLAR_TOKEN).
  if (auto token = actors::load_token(token_file, std::getenv("ASHLAR_TOKEN")))
    creds.token = *token;
  for (const char* f : {"ca.pem", "node.pem", "node.key"})
    if (!tls_dir.empty()) {
      std::ifstream in{tls_dir + "/" + f};
      creds.files.emplace_back(f, std::string{std::istreambuf_iterator<char>{in}, {}});
    }
  const std::string channel = encode_credentials(creds);
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  for (const auto& n : hosts.nodes) {
    const bool worker = n.kind == control::host_node::worker;
    std::vector<std::string> a = {exe, "node", "--role", worker ? "worker" : "server", "--join", join, "--name",
                                  n.name, "--log-level", cfg.log_level, "--launcher-stdin", "--work-dir", "/"};
    if (worker)
      a.insert(a.end(), {"--slots", std::to_string(n.slots), "--gpus", cfg.gpus});
    auto p = subprocess::start(ssh_argv(o.ssh, n.host, remote_command(a, cwd)), "", true);
    if (!p || !p->write_input(channel)) {
      std::fprintf(stderr, "ashlar launch: cannot start %s over ssh%s\n", n.name.c_str(),
                   p ? "" : (": " + describe(p.error())).c_str());
      return (stop_all(SIGKILL), false);
    }
    children.push_back(child{"[" + n.name + "]", std::move(*p), "", true, false, "", false, -1, true,
                             worker ? n.slots : 1});
  }
  return true;
}

}  // namespace ashlar::cli
