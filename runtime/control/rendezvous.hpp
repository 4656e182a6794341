// Where a node finds its scheduler when a workload manager started it: `ashlar node --join
// auto` (and the scheduler's `--listen auto`) read the variables Slurm or a Kubernetes
// training operator sets, so that every process of one job agrees on the address without
// a file, a DNS record of its own or `scontrol`. The rules, in order:
//
//   1. ASHLAR_JOIN=HOST:PORT, when set: the user's own choice.
//   2. Slurm (SLURM_JOB_ID set): the scheduler runs on the first host of the job's first
//      heterogeneous component (SLURM_JOB_NODELIST_HET_GROUP_0), or of the job's node list
//      (SLURM_JOB_NODELIST, SLURM_NODELIST) for a job of one component. The port is
//      ASHLAR_PORT, else 20000 + SLURM_JOB_ID mod 10000 (two jobs that share a first host
//      get different ports).
//   3. Kubernetes (PyTorchJob, JobSet / Trainer v2, torchrun): MASTER_ADDR and MASTER_PORT,
//      or PET_MASTER_ADDR and PET_MASTER_PORT; ASHLAR_PORT overrides the port.
//
// A job that spans several hosts must never rendezvous on loopback (each host would reach a
// scheduler of its own, or none): `check_not_loopback` refuses it, naming the variable.
// Pure: the environment comes in as a lookup function, name resolution as its result.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar::control {

/// Expands a Slurm host list ("gpu[01-03,7],cpu-a,rack[1-2]-n[1-2]") into host names, in
/// order, zero padding kept; an error names a malformed list.
expected<std::vector<std::string>> expand_hostlist(const std::string& list);

/// A variable of the environment, or nullptr when it is unset.
using env_lookup = std::function<const char*(const char*)>;

struct rendezvous {
  std::string host;      ///< the scheduler's host
  uint16_t port = 0;     ///< and port
  std::string source;    ///< the variable the host came from ("SLURM_JOB_NODELIST_HET_GROUP_0")
  std::string manager;   ///< "slurm", "kubernetes" or "ashlar" (ASHLAR_JOIN)
  uint32_t hosts = 0;    ///< the distinct hosts the job spans; 0 when the environment does not say
  std::string hosts_source; ///< the variable(s) that count them
  std::string address() const { return host + ":" + std::to_string(port); }
};

/// The scheduler's address by the rules above; an error when no workload manager's
/// variables are set, or they are malformed (naming the variable).
expected<rendezvous> rendezvous_from_env(const env_lookup& env);

/// Refuses a rendezvous on loopback for a job of several hosts: `resolved` are the addresses
/// `r.host` resolves to (as text: "127.0.0.1", "::1", "10.0.0.5").
caf::error check_not_loopback(const rendezvous& r, const std::vector<std::string>& resolved);

/// Whether an address (as text) is loopback: 127.0.0.0/8, ::1, or ::ffff:127.x.
bool is_loopback_address(const std::string& addr);

}  // namespace ashlar::control
