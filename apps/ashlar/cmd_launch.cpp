// `ashlar launch`: a scheduler, server nodes and worker nodes as separate processes on this
// machine (like torchrun --standalone), or with --hosts/--hostfile the nodes on those hosts
// over ssh (like horovodrun; runtime/control/host_plan.hpp places them), their output
// forwarded with a role prefix, all stopped on Ctrl-C or when the job ends. A member lost
// once the job runs does not end it (runtime/control/launch_supervisor.hpp says the rule).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "apps/ashlar/commands.hpp"
#include "apps/ashlar/launcher.hpp"
#include "apps/ashlar/security_options.hpp"
#include "apps/ashlar/stop_signal.hpp"
#include "apps/ashlar/train_options.hpp"
#include "actors/gpu_actor.hpp"
#include "runtime/control/host_plan.hpp"
#include "runtime/control/launch_supervisor.hpp"
#include "runtime/control/rendezvous.hpp"
#include "runtime/policy/policy_rules.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/net/tls.hpp"
#include "runtime/os/remote_start.hpp"
#include "runtime/os/subprocess.hpp"

namespace ashlar::cli {

void signal_child(child& c, int sig) {
  if (!c.remote)
    return c.proc.signal(sig);
  c.proc.write_input(signal_line(sig));
  if (sig == SIGKILL) {
    c.proc.close_input();
    c.proc.signal(SIGKILL);
  }
}

namespace {


// Where the Python package lies beside this executable: BUILD/python for a build tree
// (BUILD/apps/ashlar), PREFIX/lib/python3/dist-packages for an install (PREFIX/bin/ashlar).
std::string python_package_dir(const std::string& exe) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path{exe}.parent_path();
  for (const auto& cand : {dir / ".." / "python", dir / ".." / "lib" / "python3" / "dist-packages"}) {
    std::error_code ec;
    if (fs::exists(cand / "ashlar" / "__init__.py", ec))
      return fs::weakly_canonical(cand, ec).string();
  }
  return "";
}



// Forwards complete lines from every child's output; returns false when nothing was read.
bool pump(std::vector<child>& children, int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<child*> who;
  for (auto& c : children)
    if (c.open && c.proc.output_fd() >= 0) {
      fds.push_back(pollfd{c.proc.output_fd(), POLLIN, 0});
      who.push_back(&c);
    }
  if (fds.empty()) {
    pause_for(std::chrono::milliseconds(timeout_ms));
    return false;
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0)
    return false;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP)))
      continue;
    char buf[8192];
    ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
    auto& c = *who[i];
    if (n <= 0) {
      c.open = false;
      if (!c.pending.empty())
        std::printf("%s %s\n", c.prefix.c_str(), c.pending.c_str());
      c.pending.clear();
      continue;
    }
    c.pending.append(buf, static_cast<size_t>(n));
    size_t pos;
    while ((pos = c.pending.find('\n')) != std::string::npos) {
      std::printf("%s %s\n", c.prefix.c_str(), c.pending.substr(0, pos).c_str());
      if (pos > 0)
        c.last = c.pending.substr(0, pos);
      c.pending.erase(0, pos + 1);
    }
  }
  std::fflush(stdout);
  return true;
}

// One GPU per worker process, as torchrun gives each local rank one: worker process i
// gets device i mod n of the --gpus set (select_gpus), "none" if the set is empty. `plan`
// says which went where, or why the workers compute on the CPU. A device asked for by
// index that this machine lacks fails here, before any process starts.
expected<std::vector<std::string>> gpus_per_worker(const std::string& spec, uint32_t workers, std::string& plan) {
  auto selected = actors::select_gpus(spec);
  if (!selected)
    return selected.error();
  const auto& devices = selected->devices;
  std::vector<std::string> out(workers, "none");
  if (devices.empty()) {
    plan = "workers compute on the CPU: " + selected->why_none;
    return out;
  }
  plan = "one GPU per worker process:";
  for (uint32_t i = 0; i < workers; ++i) {
    out[i] = std::to_string(devices[i % devices.size()]);
    plan += std::string{i == 0 ? " " : ", "} + "worker " + std::to_string(i) + " -> GPU " + out[i];
  }
  if (workers > devices.size())
    plan += " (" + std::to_string(devices.size()) + " devices shared by " + std::to_string(workers) + " processes)";
  return out;
}


// The supervision's member for child `c`: its role from its prefix ("[server 0]", ...).
control::launch_member member_of(const child& c) {
  control::launch_member m;
  m.name = c.prefix.substr(1, c.prefix.size() - 2);
  m.role = c.prefix == "[scheduler]"               ? control::launch_member::scheduler
           : c.prefix.rfind("[server", 0) == 0 ? control::launch_member::server
                                               : control::launch_member::worker;
  m.script = c.script;
  m.workers = c.workers;
  return m;
}

}  // namespace

// Resolves the job and its GPUs, takes the stop signals, and makes the launch's private
// directory and the arguments every node takes. Returns the exit code, 0 when all is ready.
int launcher::prepare() {
  train = o.train;
  if (on_hosts())
    if (int rc = plan_hosts())
      return rc;
  if (auto err = resolve_config(train, cfg)) {
    std::fprintf(stderr, "ashlar launch: %s\n", describe(err).c_str());
    return 2;
  }
  if (on_hosts()) {
    plan = "each host's worker node places its workers on that host's devices (run.gpus: " + cfg.gpus + ")";
  } else {
    auto per_worker = gpus_per_worker(cfg.gpus, cfg.workers, plan);
    if (!per_worker) {
      std::fprintf(stderr, "ashlar launch: %s\n", describe(per_worker.error()).c_str());
      return 2;
    }
    gpus = std::move(*per_worker);
  }
  catch_stop_signals(false); // supervise() takes them: the first stops the job, a second every process
  exe = self_executable();
  char tmpl[] = "/tmp/ashlar-launch-XXXXXX";
  dir = ::mkdtemp(tmpl);
  port_file = dir + "/port";
  state_file = dir + "/job-state";
  if (!o.python.empty()) {
    store_dir = dir + "/store";
    if (::mkdir(store_dir.c_str(), 0700) != 0) {
      std::fprintf(stderr, "ashlar launch: cannot make %s\n", store_dir.c_str());
      return 1;
    }
  }
  token_file = o.token_file;
  if (token_file.empty() && !std::getenv("ASHLAR_TOKEN") && !write_token())
    return 1;
  if (beyond_loopback())
    if (int rc = make_tls())
      return rc;
  if (!token_file.empty())
    common = {"--token-file", token_file};
  if (!tls_dir.empty())
    common.insert(common.end(), {"--tls", tls_dir});
  // The job is the user's own, from this command line: its files go where it names them.
  common.insert(common.end(), {"--work-dir", "/"});
  return 0;
}

// Writes a token of this launch's own in its private directory: only its processes (and
// this user) can reach the cluster it starts. Returns false when it cannot be written.
bool launcher::write_token() {
  token_file = dir + "/token";
  int fd = ::open(token_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  auto line = make_token() + "\n";
  bool ok = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0)
    ::close(fd);
  if (!ok) {
    std::fprintf(stderr, "ashlar launch: cannot write %s\n", token_file.c_str());
    return false;
  }
  return true;
}

// Starts a process with `argv`, its output forwarded with `prefix`; false when it cannot start.
bool launcher::start(const std::string& prefix, const std::vector<std::string>& argv) {
  auto p = subprocess::start(argv);
  if (!p) {
    std::fprintf(stderr, "ashlar launch: %s\n", describe(p.error()).c_str());
    return false;
  }
  children.push_back(child{prefix, std::move(*p), "", true, false, "", false, -1, false, 1});
  return true;
}

// Sends `sig` to every process started.
void launcher::stop_all(int sig) {
  for (auto& c : children)
    signal_child(c, sig);
}

// Starts the scheduler node, which runs the job and exits after it; false when it cannot start.
bool launcher::start_scheduler() {
  std::vector<std::string> sched = {exe, "node", "--role", "scheduler", "--listen", sched_host + ":0",
                                    "--port-file", port_file, "--job-state-file", state_file,
                                    "--exit-after-job"};
  // A scheduler runs the job of its CONFIG: without one, the job is the defaults and the
  // flags (an empty configuration of this launch's own).
  std::string config = o.train.config_file;
  if (config.empty()) {
    config = dir + "/job.toml";
    std::ofstream{config} << "# ashlar launch: no CONFIG given; the job is the defaults and the flags\n";
  }
  sched.push_back(config);
  for (auto& a : train.as_args())
    sched.push_back(a);
  // The scripts' own model (rank 0's DistributedOptimizer said its size): their optimizers
  // update it, and the job's model is one external layer of that many parameters.
  if (script_params > 0)
    sched.insert(sched.end(), {"--set", "train.optimizer=script", "--set",
                               "model.layers=external params=" + std::to_string(script_params)
                                 + " out=" + std::to_string(cfg.model.classes)});
  sched.insert(sched.end(), common.begin(), common.end());
  if (!start("[scheduler]", sched))
    return false;
  // Started after the worker scripts with --python: it goes first all the same.
  std::rotate(children.begin(), children.end() - 1, children.end());
  return true;
}

// Waits (30 s at most) for the scheduler's port, then sets the address the nodes join.
// Returns the exit code, 0 when the scheduler listens.
int launcher::wait_for_scheduler() {
  std::string port;
  auto deadline = steady_now() + std::chrono::seconds(30);
  while (port.empty()) {
    pump(children, 50);
    std::ifstream in{port_file};
    std::getline(in, port);
    int exit_code;
    if (children[0].proc.poll_exit(exit_code)) {
      pump(children, 0);
      std::fprintf(stderr, "ashlar launch: the scheduler exited with code %d before listening\n", exit_code);
      return exit_code ? exit_code : 1;
    }
    if (steady_now() > deadline || stop_signal() != 0) {
      stop_all(SIGKILL);
      std::fprintf(stderr, "ashlar launch: the scheduler did not start listening within 30 s\n");
      return 1;
    }
  }
  join = sched_host + ":" + port;
  return 0;
}

// Starts the server nodes; false (every process killed) when one cannot start.
bool launcher::start_servers() {
  if (on_hosts())
    return start_host_nodes();
  std::printf("[launch] scheduler at %s; starting %u server and %u worker processes\n", join.c_str(),
              cfg.servers, cfg.workers);
  std::fflush(stdout);
  for (uint32_t i = 0; i < cfg.servers; ++i) {
    std::vector<std::string> a = {exe, "node", "--role", "server", "--join", join, "--name",
                                  "server-" + std::to_string(i), "--log-level", cfg.log_level};
    a.insert(a.end(), common.begin(), common.end());
    if (!start("[server " + std::to_string(i) + "]", a))
      return (stop_all(SIGKILL), false);
  }
  return true;
}

// With --python, the PYTHONPATH of the worker scripts, which finds the Python package beside
// this executable (and says what the workers run); "" without --python.
std::string launcher::worker_pythonpath() const {
  std::string pythonpath;
  if (o.python.empty())
    return pythonpath;
  pythonpath = python_package_dir(exe);
  if (const char* old = std::getenv("PYTHONPATH"); old && *old)
    pythonpath += (pythonpath.empty() ? "" : ":") + std::string{old};
  std::printf("[launch] worker processes run %s %s%s\n", o.python_exe.c_str(), o.python.c_str(),
              pythonpath.empty() ? "" : (" (PYTHONPATH=" + pythonpath + ")").c_str());
  return pythonpath;
}

// The command line of worker process `i`: a worker node, or with --python the user's script.
std::vector<std::string> launcher::worker_argv(uint32_t i, const std::string& pythonpath) const {
  std::vector<std::string> a = {exe, "node", "--role", "worker", "--join", join, "--name",
                                "worker-" + std::to_string(i), "--log-level", cfg.log_level,
                                "--gpus", gpus[i]};
  a.insert(a.end(), common.begin(), common.end());
  if (!o.python.empty()) {
    // The script's device, as torchrun pins a local rank: CUDA_VISIBLE_DEVICES holds
    // this worker's GPU (none: empty, the CPU), so that ashlar.device() is "cuda" there.
    const auto& gpu = gpus[i];
    // The scripts start before the scheduler: each finds its address in ASHLAR_JOIN_FILE
    // once rank 0 has said which model the job trains (ASHLAR_STORE_DIR/model).
    const std::string w = std::to_string(cfg.workers);
    a = {"env", "ASHLAR_JOIN_FILE=" + dir + "/join", "ASHLAR_STORE_DIR=" + store_dir,
         "ASHLAR_NAME=worker-" + std::to_string(i), "ASHLAR_CONFIG=" + o.train.config_file,
         "ASHLAR_RANK=" + std::to_string(i), "ASHLAR_SIZE=" + w, "ASHLAR_LOCAL_RANK=" + std::to_string(i),
         "ASHLAR_LOCAL_SIZE=" + w, "ASHLAR_POLICY=" + cfg.policy, "ASHLAR_GPU=" + gpu,
         "CUDA_VISIBLE_DEVICES=" + (gpu == "none" ? std::string{} : gpu)};
    if (!token_file.empty())
      a.push_back("ASHLAR_TOKEN_FILE=" + token_file);
    if (!pythonpath.empty())
      a.push_back("PYTHONPATH=" + pythonpath);
    a.insert(a.end(), {o.python_exe, o.python});
    a.insert(a.end(), o.script_args.begin(), o.script_args.end());
  }
  return a;
}

// Starts the worker processes, after saying where their GPUs are; false (every process
// killed) when one cannot start.
bool launcher::start_workers() {
  if (on_hosts())
    return true; // start_host_nodes started them with the servers
  std::printf("[launch] %s\n", plan.c_str());
  std::fflush(stdout);
  // --python: each worker process is the user's script, which joins through the Python
  // package (ashlar.init() reads the ASHLAR_* variables set here).
  const std::string pythonpath = worker_pythonpath();
  for (uint32_t i = 0; i < cfg.workers; ++i) {
    if (!start("[worker " + std::to_string(i) + "]", worker_argv(i, pythonpath)))
      return (stop_all(SIGKILL), false);
    children.back().script = !o.python.empty();
    children.back().rank = static_cast<int>(i);
  }
  return true;
}

// --python: waits until rank 0's script says which model the job trains (its file
// `model` in the store: "job", the job's model, or "params N", the scripts' own of N
// parameters). Returns the exit code, 0 once it has; a script that exits first, or a
// stop signal, ends the launch.
int launcher::wait_for_script_model() {
  const std::string file = store_dir + "/model";
  for (;;) {
    pump(children, 100);
    std::ifstream in{file};
    std::string kind;
    if (in >> kind) {
      if (kind == "job")
        return 0;
      uint64_t n = 0;
      if (kind == "params" && (in >> n) && n > 0 && n <= max_model_params) {
        script_params = n;
        std::printf("[launch] the scripts train their own model: %llu parameters, updated by their optimizers\n",
                    static_cast<unsigned long long>(n));
        std::fflush(stdout);
        return 0;
      }
      std::fprintf(stderr, "ashlar launch: %s says '%s': not a model the job can train\n", file.c_str(), kind.c_str());
      return (stop_all(SIGKILL), 1);
    }
    for (auto& c : children) {
      int x;
      if (c.exited || !c.proc.poll_exit(x))
        continue;
      c.exited = true;
      note_left(c);
      pump(children, 0);
      std::printf("[launch] %s exited with code %d before the job started%s; stopping the job\n", c.prefix.c_str(), x,
                  c.last.empty() ? "" : (": " + c.last).c_str());
      std::fflush(stdout);
      failed_member = c.prefix.substr(1, c.prefix.size() - 2) + " exited with code " + std::to_string(x)
                      + (c.last.empty() ? std::string{} : ": " + c.last);
      stop_all(SIGTERM);
      while (!all_exited())
        pump(children, 100);
      return x > 0 && x < 128 ? x : 1;
    }
    if (take_stop_signal() != 0) {
      std::printf("[launch] interrupted before the job started: stopping the scripts\n");
      stop_all(SIGTERM);
      while (!all_exited())
        pump(children, 100);
      return 130;
    }
  }
}

// Writes the scheduler's address where the scripts wait for it (whole, or not at all:
// written aside, then renamed). False when it cannot be written.
bool launcher::publish_join() {
  const std::string file = dir + "/join", tmp = file + ".tmp";
  {
    std::ofstream out{tmp};
    out << join << "\n";
    if (!out)
      return false;
  }
  return std::rename(tmp.c_str(), file.c_str()) == 0;
}

// A worker script that ended: the store says so, so that the others' collectives
// (ashlar.torch.allreduce, ...) do not wait for it.
void launcher::note_left(const child& c) {
  if (c.rank < 0 || store_dir.empty())
    return;
  std::ofstream{store_dir + "/left-" + std::to_string(c.rank)} << "left\n";
}


// Whether the scheduler said its job has every member (its job-state file reads "running").
bool launcher::job_running() const {
  std::ifstream in{state_file};
  std::string word;
  return (in >> word) && word == "running";
}

// Carries out the supervision's actions: signals, the store's notes, the launch's lines.
void launcher::act(const std::vector<control::launch_action>& actions) {
  for (const auto& a : actions) {
    switch (a.kind) {
      case control::launch_action::signal:
        if (a.member < 0)
          stop_all(a.sig);
        else
          signal_child(children[static_cast<size_t>(a.member)], a.sig);
        break;
      case control::launch_action::note_left:
        note_left(children[static_cast<size_t>(a.member)]);
        break;
      case control::launch_action::say:
        std::printf("[launch] %s\n", a.text.c_str());
        std::fflush(stdout);
        break;
    }
  }
}

// Forwards the processes' output and turns their exits, the scheduler's job state and stop
// signals into the supervision's events (runtime/control/launch_supervisor.hpp), until every
// process has ended. Returns the exit code.
int launcher::supervise() {
  std::vector<control::launch_member> members;
  for (const auto& c : children)
    members.push_back(member_of(c));
  control::launch_supervisor sup{system_clock(), std::move(members), {}, cfg.min_workers};
  bool running = false;
  while (sup.state() != control::launch_supervisor::phase::ended) {
    pump(children, 100);
    if (!running && job_running()) {
      running = true;
      act(sup.on_job_running());
    }
    if (int sig = take_stop_signal(); sig != 0)
      act(sup.on_stop_signal(sig));
    for (size_t i = 0; i < children.size(); ++i) {
      int x;
      if (sup.exited(i) || !children[i].proc.poll_exit(x))
        continue;
      children[i].exited = true;
      pump(children, 0); // what it said last
      act(sup.on_exit(i, x, children[i].last));
    }
    act(sup.on_time());
  }
  code = sup.exit_code();
  failed_member = sup.failure();
  return finish();
}

// Whether every process started has exited (each one polled).
bool launcher::all_exited() {
  bool all_done = true;
  for (auto& c : children) {
    int x;
    if (!c.proc.poll_exit(x))
      all_done = false;
  }
  return all_done;
}

// Forwards the output left, says why the job failed when a member did, and removes the
// launch's private directory. Returns the exit code.
int launcher::finish() {
  while (pump(children, 0)) {
  }
  if (!failed_member.empty()) {
    std::fprintf(stderr, "ashlar launch: the job failed: %s\n", failed_member.c_str());
    code = code == 0 ? 1 : code;
  }
  remove_files();
  return code;
}

// Removes the launch's private directory and what it holds (idempotent).
void launcher::remove_files() {
  if (dir.empty())
    return;
  std::remove(port_file.c_str());
  std::remove(state_file.c_str());
  std::remove((dir + "/token").c_str());
  std::remove((dir + "/join").c_str());
  std::remove((dir + "/job.toml").c_str());
  std::error_code ec;
  if (!tls_dir.empty()) {
    std::filesystem::remove_all(tls_dir, ec);
    std::filesystem::remove_all(dir + "/ca", ec);
  }
  if (!store_dir.empty())
    std::filesystem::remove_all(store_dir, ec);
  ::rmdir(dir.c_str());
  dir.clear();
}

// Runs the job as separate processes on this machine; returns the exit code.
static int run_launch(const launch_options& o) {
  launcher launch{o};
  if (int code = launch.prepare())
    return code;
  if (launch.on_hosts())
    if (int code = launch.check_hosts(); code || (code = launch.pick_scheduler_address()))
      return (launch.finish(), code);
  if (o.python.empty()) {
    if (!launch.start_scheduler())
      return 1;
    if (int code = launch.wait_for_scheduler())
      return code;
    if (!launch.start_servers() || !launch.start_workers())
      return 1;
    return launch.supervise();
  }
  // --python: the scripts first (rank 0's model decides the job's), then the scheduler,
  // whose address they read from the join file, then the servers.
  if (!launch.start_workers())
    return 1;
  if (int code = launch.wait_for_script_model())
    return (launch.finish(), code);
  if (!launch.start_scheduler())
    return (launch.stop_all(SIGKILL), launch.finish(), 1);
  if (int code = launch.wait_for_scheduler())
    return (launch.finish(), code);
  if (!launch.publish_join() || !launch.start_servers())
    return (launch.stop_all(SIGKILL), launch.finish(), 1);
  return launch.supervise();
}

std::vector<std::string>& launch_script_args() {
  static std::vector<std::string> args;
  return args;
}

command_fn add_launch(CLI::App& app) {
  auto o = std::make_shared<launch_options>();
  auto* cmd = app.add_subcommand(
    "launch", "Run a job as separate processes on this machine: scheduler, servers, workers");
  cmd->footer(key_help());
  add_train_options(cmd, o->train);
  cmd->add_option("--token-file", o->token_file, "cluster token file passed to every node");
  cmd->add_option("--python", o->python,
                  "each worker process runs this Python script (what follows `--` is its own arguments), which "
                  "joins with ashlar.init() or `import ashlar.torch as hvd` (the Python package; ASHLAR_JOIN_FILE, "
                  "ASHLAR_STORE_DIR, ASHLAR_RANK, ASHLAR_SIZE, ASHLAR_LOCAL_SIZE, ASHLAR_POLICY, ASHLAR_TOKEN_FILE, ASHLAR_NAME, ASHLAR_CONFIG, ASHLAR_LOCAL_RANK, ASHLAR_GPU and "
                  "CUDA_VISIBLE_DEVICES (the worker's GPU, empty for none) are set for it)")
    ->check(CLI::ExistingFile);
  cmd->add_option("--hosts", o->hosts,
                  "run the nodes on these hosts over ssh, HOST:SLOTS each (h1:4,h2:2; no count: 1): one worker node "
                  "per host with its slots as workers (the job's workers: every slot, or --workers of them in host "
                  "order), server i on host i mod H; the scheduler runs here")
    ->group("Hosts");
  cmd->add_option("--hostfile", o->hostfile, "the hosts, one per line: HOST slots=N (Horovod's and DeepSpeed's form)")
    ->check(CLI::ExistingFile)
    ->group("Hosts");
  cmd->add_option("--ssh-port", o->ssh.port, "the hosts' ssh port (default: ssh's own)")->group("Hosts");
  cmd->add_option("--ssh-identity-file", o->ssh.identity_file, "the key ssh logs in with (default: ssh's own)")
    ->group("Hosts");
  cmd->add_option("--ssh-config", o->ssh.config_file, "an ssh_config file for reaching the hosts (ssh -F)")
    ->group("Hosts");
  cmd->add_option("--ssh-connect-timeout", o->ssh.connect_timeout_s, "seconds ssh tries to reach a host")
    ->capture_default_str()
    ->check(CLI::Range(1.0, 600.0))
    ->group("Hosts");
  cmd->add_option("--scheduler-address", o->scheduler_address,
                  "the address of this host the others reach the scheduler at (default: the local address on the "
                  "route to the first host; never loopback)")
    ->group("Hosts");
  o->python_exe = ASHLAR_PYTHON_EXE;
  cmd->add_option("--python-exe", o->python_exe, "the interpreter for --python")->capture_default_str();
  return [o] {
    o->script_args = launch_script_args();
    return run_launch(*o);
  };
}

}  // namespace ashlar::cli
