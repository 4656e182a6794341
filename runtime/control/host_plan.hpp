// `ashlar launch --hosts h1:4,h2:2` (or --hostfile FILE): which node runs on which host, as
// horovodrun places its ranks. The rules:
//
//   - A host's count is its slots: the worker processes it may run (no count: 1). A hostfile
//     has one host per line, as Horovod, DeepSpeed and Open MPI write them ("gpu1 slots=4",
//     also "gpu1:4" or "gpu1"); '#' starts a comment. A host named twice is refused.
//   - The job's workers are every slot, unless a number is asked for (--workers): then the
//     slots are filled in host order, and asking for more than the hosts offer is refused.
//   - Each host with workers runs one worker node hosting them (`ashlar node --role worker
//     --slots N`); server node i runs on host i mod H, in the list's order.
//   - The scheduler runs where the launch does. A job whose hosts are all loopback stays on
//     loopback; a job with any other host needs the scheduler at an address the hosts reach
//     (never loopback: `check_not_loopback`), and the nodes' traffic uses TLS.
// Pure: no process, socket or file here (a hostfile comes in as its text).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar::control {

struct host_slots {
  std::string host;     ///< as the user wrote it (a name, an IPv4 address, or [IPv6])
  uint32_t slots = 1;   ///< worker processes it may run
  std::string where;    ///< where it was written: "--hosts entry 2", "hosts.txt:3"
};

/// Parses "h1:4,h2:2,h3" (h3: one slot; "[::1]:2" for IPv6). An error names the entry.
expected<std::vector<host_slots>> parse_host_list(const std::string& list);

/// Parses a hostfile's text (`file` names it in errors).
expected<std::vector<host_slots>> parse_hostfile(const std::string& text, const std::string& file);

struct host_node {
  enum kind_t { server, worker } kind = worker;
  std::string host;
  uint32_t slots = 0;   ///< a worker node's workers
  std::string name;     ///< "worker@h1", "server-0@h2"
};

struct host_plan {
  std::vector<host_node> nodes; ///< the servers first, then the workers, in host order
  uint32_t workers = 0;
  uint32_t servers = 0;
  bool loopback_only = true;    ///< every host is loopback: the job stays on this machine's loopback
  /// "h1: 4 workers, server-0; h2: 2 workers"
  std::string describe() const;
};

/// Places `servers` server nodes and `workers` workers (0: every slot) on `hosts`.
/// Fails naming what does not fit: no host, no server asked, more workers than slots.
expected<host_plan> plan_hosts(const std::vector<host_slots>& hosts, uint32_t workers, uint32_t servers);

/// Whether `host` (as written in a host list) is this machine's loopback: "localhost",
/// 127.0.0.0/8, ::1 (with or without brackets).
bool is_loopback_host(const std::string& host);

} // namespace ashlar::control
