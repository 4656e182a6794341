// `ashlar launch`'s launcher (apps/ashlar/cmd_launch.cpp; its --hosts part in
// launch_hosts.cpp): the processes it starts and how it supervises them. Internal to the
// command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/ashlar/train_options.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/control/host_plan.hpp"
#include "runtime/control/launch_supervisor.hpp"
#include "runtime/os/remote_start.hpp"
#include "runtime/os/subprocess.hpp"

namespace ashlar::cli {

struct launch_options {
  train_options train;
  std::string token_file;
  uint32_t slots = 1;
  std::string python;     // a Python script each worker process runs instead of `ashlar node`
  std::string python_exe; // its interpreter
  std::vector<std::string> script_args; // what follows `--`: the script's own arguments
  std::string hosts;      // --hosts h1:4,h2:2: the nodes run on these hosts, over ssh
  std::string hostfile;   // --hostfile FILE: the same, one host per line
  ssh_options ssh;        // how the hosts are reached
  std::string scheduler_address; // --hosts: where the hosts reach the scheduler ("": the route's)
};

/// One process the launch started, and what it said.
struct child {
  std::string prefix;
  subprocess proc;
  std::string pending; // partial line
  bool open = true;
  bool script = false; // a --python worker: it ends by itself once its job is over
  std::string last;     // its last line of output (what a process that died last said)
  bool exited = false;  // its exit was seen
  int rank = -1;        // a worker process's index (its script's rank), -1 for the others
  bool remote = false;  // a node on another host under ssh: signals go over its stdin
  uint32_t workers = 1; // the workers it hosts (a worker node of N slots)
};

/// Sends `sig` to `c`: a local process directly; a node under ssh over its channel (SIGKILL
/// also ends its ssh, whose end stops the node).
void signal_child(child& c, int sig);

// One `ashlar launch`: the processes it starts (the scheduler, then the servers and the
// workers) and their supervision until every one has ended.
struct launcher {
  explicit launcher(const launch_options& opts) : o(opts) {}
  // However the launch ends, its private directory (the token, the CA's key) goes with it.
  ~launcher() { remove_files(); }

  const launch_options& o;
  train_options train;             // the job's options: o.train, with --hosts' workers and servers
  train_config cfg;                // the job
  std::string plan;                // which GPU each worker process gets, or why they compute on the CPU
  std::vector<std::string> gpus;   // per worker process, its --gpus
  std::string exe;                 // this executable, which every node runs
  std::string dir;                 // this launch's private directory
  std::string port_file;           // where the scheduler writes the port it listens on
  std::string token_file;          // every node's (and worker script's) token file, if any
  std::vector<std::string> common; // the arguments of every node
  std::vector<child> children;     // the scheduler first, then the servers and the workers
  std::string join;                // the scheduler's address
  std::string state_file;          // where the scheduler says its job has every member
  int code = 0;                    // the exit code
  std::string failed_member;       // a server or worker process that failed, and what it said last
  std::string store_dir;           // --python: the scripts' store (ashlar.torch's collectives), in `dir`
  uint64_t script_params = 0;      // --python: the parameters of the scripts' own model; 0: the job's model
  control::host_plan hosts;        // --hosts: which node runs where
  std::string tls_dir;             // --hosts beyond loopback: this launch's own TLS credentials
  std::string sched_host = "127.0.0.1"; // the host part of the address the nodes join

  bool on_hosts() const { return !o.hosts.empty() || !o.hostfile.empty(); }
  bool beyond_loopback() const { return on_hosts() && !hosts.loopback_only; }
  int plan_hosts();
  int pick_scheduler_address();
  int make_tls();
  int check_hosts();
  bool start_host_nodes();

  int prepare();
  bool write_token();
  bool start(const std::string& prefix, const std::vector<std::string>& argv);
  void stop_all(int sig);
  bool start_scheduler();
  int wait_for_scheduler();
  bool start_servers();
  std::string worker_pythonpath() const;
  std::vector<std::string> worker_argv(uint32_t i, const std::string& pythonpath) const;
  bool start_workers();
  int wait_for_script_model();
  bool publish_join();
  void note_left(const child& c);
  bool job_running() const;
  void act(const std::vector<control::launch_action>& actions);
  int supervise();
  bool all_exited();
  int finish();
  void remove_files();
};

}  // namespace ashlar::cli
