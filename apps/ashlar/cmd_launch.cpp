// `ashlar launch`: a scheduler, server nodes and worker nodes as separate processes on this
// machine (like torchrun --standalone), their output forwarded with a role prefix, all
// stopped on Ctrl-C or when the job ends.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <thread>
#include <unistd.h>

#include "apps/ashlar/commands.hpp"
#include "apps/ashlar/security_options.hpp"
#include "apps/ashlar/stop_signal.hpp"
#include "apps/ashlar/train_options.hpp"
#include "actors/gpu_actor.hpp"
#include "runtime/os/subprocess.hpp"

namespace ashlar::cli {

namespace {


struct launch_options {
  train_options train;
  std::string token_file;
  uint32_t slots = 1;
  std::string python;     // a Python script each worker process runs instead of `ashlar node`
  std::string python_exe; // its interpreter
};

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

struct child {
  std::string prefix;
  subprocess proc;
  std::string pending; // partial line
  bool open = true;
  bool script = false; // a --python worker: it ends by itself once its job is over
  std::string last;     // its last line of output (what a process that died last said)
  bool exited = false;  // its exit was seen
};

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
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
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

int run_launch(const launch_options& o) {
  train_config cfg;
  if (auto err = resolve_config(o.train, cfg)) {
    std::fprintf(stderr, "ashlar launch: %s\n", describe(err).c_str());
    return 2;
  }
  std::string plan;
  auto gpus = gpus_per_worker(cfg.gpus, cfg.workers, plan);
  if (!gpus) {
    std::fprintf(stderr, "ashlar launch: %s\n", describe(gpus.error()).c_str());
    return 2;
  }
  catch_stop_signals(false); // the loop below takes them: the first stops the job, a second every process
  const std::string exe = self_executable();
  char tmpl[] = "/tmp/ashlar-launch-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  const std::string port_file = dir + "/port";
  std::string token_file = o.token_file; // every node's (and worker script's) token file, if any
  if (token_file.empty() && !std::getenv("ASHLAR_TOKEN")) {
    // A token of this launch's own, in its private directory: only its processes (and
    // this user) can reach the cluster it starts.
    token_file = dir + "/token";
    int fd = ::open(token_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    auto line = make_token() + "\n";
    bool ok = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    if (fd >= 0)
      ::close(fd);
    if (!ok) {
      std::fprintf(stderr, "ashlar launch: cannot write %s\n", token_file.c_str());
      return 1;
    }
  }
  std::vector<std::string> common;
  if (!token_file.empty())
    common = {"--token-file", token_file};
  // The job is the user's own, from this command line: its files go where it names them.
  common.insert(common.end(), {"--work-dir", "/"});

  std::vector<child> children;
  auto start = [&](const std::string& prefix, std::vector<std::string> argv) {
    auto p = subprocess::start(argv);
    if (!p) {
      std::fprintf(stderr, "ashlar launch: %s\n", describe(p.error()).c_str());
      return false;
    }
    children.push_back(child{prefix, std::move(*p), "", true, false, "", false});
    return true;
  };
  auto stop_all = [&](int sig) {
    for (auto& c : children)
      c.proc.signal(sig);
  };

  std::vector<std::string> sched = {exe, "node", "--role", "scheduler", "--listen", "127.0.0.1:0",
                                    "--port-file", port_file, "--exit-after-job"};
  if (!o.train.config_file.empty())
    sched.push_back(o.train.config_file);
  for (auto& a : o.train.as_args())
    sched.push_back(a);
  sched.insert(sched.end(), common.begin(), common.end());
  if (!start("[scheduler]", sched))
    return 1;

  // Wait for the scheduler's port.
  std::string port;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (port.empty()) {
    pump(children, 50);
    std::ifstream in{port_file};
    std::getline(in, port);
    int code;
    if (children[0].proc.poll_exit(code)) {
      pump(children, 0);
      std::fprintf(stderr, "ashlar launch: the scheduler exited with code %d before listening\n", code);
      return code ? code : 1;
    }
    if (std::chrono::steady_clock::now() > deadline || stop_signal() != 0) {
      stop_all(SIGKILL);
      std::fprintf(stderr, "ashlar launch: the scheduler did not start listening within 30 s\n");
      return 1;
    }
  }
  std::string join = "127.0.0.1:" + port;
  std::printf("[launch] scheduler at %s; starting %u server and %u worker processes\n", join.c_str(),
              cfg.servers, cfg.workers);
  std::fflush(stdout);
  for (uint32_t i = 0; i < cfg.servers; ++i) {
    std::vector<std::string> a = {exe, "node", "--role", "server", "--join", join, "--name",
                                  "server-" + std::to_string(i), "--log-level", cfg.log_level};
    a.insert(a.end(), common.begin(), common.end());
    if (!start("[server " + std::to_string(i) + "]", a))
      return (stop_all(SIGKILL), 1);
  }
  std::printf("[launch] %s\n", plan.c_str());
  std::fflush(stdout);
  // --python: each worker process is the user's script, which joins through the Python
  // package (ashlar.init() reads the ASHLAR_* variables set here).
  std::string pythonpath;
  if (!o.python.empty()) {
    pythonpath = python_package_dir(exe);
    if (const char* old = std::getenv("PYTHONPATH"); old && *old)
      pythonpath += (pythonpath.empty() ? "" : ":") + std::string{old};
    std::printf("[launch] worker processes run %s %s%s\n", o.python_exe.c_str(), o.python.c_str(),
                pythonpath.empty() ? "" : (" (PYTHONPATH=" + pythonpath + ")").c_str());
  }
  for (uint32_t i = 0; i < cfg.workers; ++i) {
    std::vector<std::string> a = {exe, "node", "--role", "worker", "--join", join, "--name",
                                  "worker-" + std::to_string(i), "--log-level", cfg.log_level,
                                  "--gpus", (*gpus)[i]};
    a.insert(a.end(), common.begin(), common.end());
    if (!o.python.empty()) {
      // The script's device, as torchrun pins a local rank: CUDA_VISIBLE_DEVICES holds
      // this worker's GPU (none: empty, the CPU), so that ashlar.device() is "cuda" there.
      const auto& gpu = (*gpus)[i];
      a = {"env", "ASHLAR_JOIN=" + join, "ASHLAR_NAME=worker-" + std::to_string(i),
           "ASHLAR_CONFIG=" + o.train.config_file, "ASHLAR_LOCAL_RANK=" + std::to_string(i),
           "ASHLAR_GPU=" + gpu, "CUDA_VISIBLE_DEVICES=" + (gpu == "none" ? std::string{} : gpu)};
      if (!token_file.empty())
        a.push_back("ASHLAR_TOKEN_FILE=" + token_file);
      if (!pythonpath.empty())
        a.push_back("PYTHONPATH=" + pythonpath);
      a.insert(a.end(), {o.python_exe, o.python});
    }
    if (!start("[worker " + std::to_string(i) + "]", a))
      return (stop_all(SIGKILL), 1);
    children.back().script = !o.python.empty();
  }

  int code = 0;
  bool stopping = false;    // the job is over: the other processes are stopping
  bool interrupted = false; // a signal asked the scheduler to stop the job
  bool scripts_waiting = false; // the job is over; --python workers are given time to end
  std::string failed_member;    // a server or worker process that failed, and what it said last
  auto stop_deadline = std::chrono::steady_clock::now();
  for (;;) {
    pump(children, 100);
    if (int sig = take_stop_signal(); sig != 0) {
      code = 130;
      if (!interrupted && !stopping) {
        // The scheduler stops the job after the workers' current step, with its final
        // evaluation and report, then the cluster; a second signal stops every process.
        std::printf("[launch] %s: stopping the job after the workers' current step (again: stop every "
                    "process now)\n", sig == SIGINT ? "interrupted" : "terminated");
        interrupted = true;
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        children[0].proc.signal(SIGTERM);
      } else {
        std::printf("[launch] %s again: stopping every process\n", sig == SIGINT ? "interrupted" : "terminated");
        stop_all(stopping ? SIGKILL : SIGTERM);
        if (!stopping) {
          stopping = true;
          stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        }
      }
      std::fflush(stdout);
    }
    int sc;
    if (!stopping && children[0].proc.poll_exit(sc)) {
      // The job is over: the others get a polite stop, then a hard one. A worker script
      // ends by itself when its loop does (it may save its model after): it gets the
      // polite stop only if it has not ended 10 s later.
      if (!interrupted)
        code = sc;
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (size_t i = 1; i < children.size(); ++i)
        if (!children[i].script || interrupted)
          children[i].proc.signal(SIGTERM);
      scripts_waiting = !interrupted && !o.python.empty();
    }
    // A server or worker process that fails while the job runs (a script without its
    // modules, a crash before joining): the job cannot have its members, so it is stopped
    // now, naming the process, rather than waiting for slots that will never come.
    if (!stopping && !interrupted)
      for (size_t i = 1; i < children.size(); ++i) {
        auto& c = children[i];
        int x;
        if (c.exited || !c.proc.poll_exit(x))
          continue;
        c.exited = true;
        if (x == 0)
          continue;
        pump(children, 0);
        std::printf("[launch] %s exited with code %d before the job ended%s; stopping the job\n", c.prefix.c_str(),
                    x, c.last.empty() ? "" : (": " + c.last).c_str());
        std::fflush(stdout);
        failed_member = c.prefix.substr(1, c.prefix.size() - 2) + " exited with code " + std::to_string(x)
                        + (c.last.empty() ? std::string{} : ": " + c.last);
        code = x > 0 && x < 128 ? x : 1;
        interrupted = true;
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        children[0].proc.signal(SIGTERM);
        break;
      }
    if (interrupted && !stopping && std::chrono::steady_clock::now() > stop_deadline) {
      // The scheduler did not stop the job in time.
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      stop_all(SIGTERM);
    }
    bool all_done = true;
    for (auto& c : children) {
      int x;
      if (!c.proc.poll_exit(x))
        all_done = false;
    }
    if (all_done)
      break;
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      if (scripts_waiting) {
        scripts_waiting = false; // the scripts had their time: now the polite stop, then the hard one
        for (auto& c : children)
          if (c.script)
            c.proc.signal(SIGTERM);
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      } else {
        stop_all(SIGKILL);
      }
    }
  }
  while (pump(children, 0)) {
  }
  if (!failed_member.empty()) {
    std::fprintf(stderr, "ashlar launch: the job failed: %s\n", failed_member.c_str());
    code = code == 0 ? 1 : code;
  }
  std::remove(port_file.c_str());
  std::remove((dir + "/token").c_str());
  ::rmdir(dir.c_str());
  return code;
}

}  // namespace

command_fn add_launch(CLI::App& app) {
  auto o = std::make_shared<launch_options>();
  auto* cmd = app.add_subcommand(
    "launch", "Run a job as separate processes on this machine: scheduler, servers, workers");
  cmd->footer(key_help());
  add_train_options(cmd, o->train);
  cmd->add_option("--token-file", o->token_file, "cluster token file passed to every node");
  cmd->add_option("--python", o->python,
                  "each worker process runs this Python script, which joins with ashlar.init() (the Python "
                  "package; ASHLAR_JOIN, ASHLAR_TOKEN_FILE, ASHLAR_NAME, ASHLAR_CONFIG, ASHLAR_LOCAL_RANK, ASHLAR_GPU and "
                  "CUDA_VISIBLE_DEVICES (the worker's GPU, empty for none) are set for it)")
    ->check(CLI::ExistingFile);
  o->python_exe = ASHLAR_PYTHON_EXE;
  cmd->add_option("--python-exe", o->python_exe, "the interpreter for --python")->capture_default_str();
  return [o] { return run_launch(*o); };
}

}  // namespace ashlar::cli
