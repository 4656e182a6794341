// `--join auto` (runtime/control/rendezvous.hpp): Slurm's host lists and variables, the
// Kubernetes operators' variables, and the refusal of a multi-host rendezvous on loopback.
#include <catch2/catch.hpp>

#include <map>

#include "runtime/control/rendezvous.hpp"

using namespace ashlar;
using namespace ashlar::control;

namespace {

env_lookup env_of(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto i = held->find(name);
    return i == held->end() ? nullptr : i->second.c_str();
  };
}

std::vector<std::string> hosts(const std::string& list) {
  auto h = expand_hostlist(list);
  REQUIRE(h);
  return *h;
}

} // namespace

TEST_CASE("a Slurm host list expands as Slurm writes it: ranges, lists in brackets, zero padding, several groups") {
  using v = std::vector<std::string>;
  CHECK(hosts("n1") == v{"n1"});
  CHECK(hosts("n[1-3]") == v{"n1", "n2", "n3"});
  CHECK(hosts("gpu[08-10,15],cpu-a") == v{"gpu08", "gpu09", "gpu10", "gpu15", "cpu-a"});
  CHECK(hosts("rack[1-2]-n[1-2]") == v{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(hosts("a,b[001-002].site") == v{"a", "b001.site", "b002.site"});
  CHECK(hosts("").empty());
  for (const char* bad : {"n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[[1]]", "a,,b", "n[1-99999999]"}) {
    auto h = expand_hostlist(bad);
    INFO(bad);
    REQUIRE_FALSE(h);
    CHECK(describe(h.error()).find(std::string{"host list '"} + bad + "'") != std::string::npos);
  }
}

TEST_CASE("inside a Slurm job the scheduler is the first host of the first component, on a port of the job's id") {
  // A heterogeneous job: component 0 runs the scheduler, 1 and 2 are worker classes.
  auto het = rendezvous_from_env(env_of({{"SLURM_JOB_ID", "1234567"},
                                         {"SLURM_JOB_NODELIST", "ctl01"},
                                         {"SLURM_HET_SIZE", "3"},
                                         {"SLURM_JOB_NODELIST_HET_GROUP_0", "ctl01"},
                                         {"SLURM_JOB_NODELIST_HET_GROUP_1", "gpu[01-02]"},
                                         {"SLURM_JOB_NODELIST_HET_GROUP_2", "cpu[1-4],ctl01"}}));
  REQUIRE(het);
  CHECK(het->host == "ctl01");
  CHECK(het->port == 20000 + 4567);
  CHECK(het->source == "SLURM_JOB_NODELIST_HET_GROUP_0");
  CHECK(het->hosts == 7); // ctl01 counted once
  CHECK(het->manager == "slurm");
  // One component: its node list; ASHLAR_PORT chooses the port.
  auto one = rendezvous_from_env(env_of({{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "node[07-09]"},
                                         {"ASHLAR_PORT", "7400"}}));
  REQUIRE(one);
  CHECK(one->address() == "node07:7400");
  CHECK(one->hosts == 3);
  CHECK(one->source == "SLURM_JOB_NODELIST");
  // Malformed: named.
  auto bad = rendezvous_from_env(env_of({{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "node[07-"}}));
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("SLURM_JOB_NODELIST: ") != std::string::npos);
  auto port = rendezvous_from_env(env_of({{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n1"}, {"ASHLAR_PORT", "99999"}}));
  REQUIRE_FALSE(port);
  CHECK(describe(port.error()).find("ASHLAR_PORT=99999 is not a port") != std::string::npos);
  auto none = rendezvous_from_env(env_of({{"SLURM_JOB_ID", "42"}}));
  REQUIRE_FALSE(none);
  CHECK(describe(none.error()).find("none of SLURM_JOB_NODELIST_HET_GROUP_0") != std::string::npos);
}

TEST_CASE("under a Kubernetes training operator the scheduler is MASTER_ADDR, or PET_MASTER_ADDR, and ASHLAR_JOIN wins") {
  auto pj = rendezvous_from_env(env_of({{"MASTER_ADDR", "ashlar-scheduler"}, {"MASTER_PORT", "7400"},
                                        {"WORLD_SIZE", "5"}, {"RANK", "3"}}));
  REQUIRE(pj);
  CHECK(pj->address() == "ashlar-scheduler:7400");
  CHECK(pj->hosts == 5);
  CHECK(pj->manager == "kubernetes");
  auto pet = rendezvous_from_env(env_of({{"PET_MASTER_ADDR", "job-node-0-0.job"}, {"PET_MASTER_PORT", "29400"},
                                         {"PET_NNODES", "2"}}));
  REQUIRE(pet);
  CHECK(pet->address() == "job-node-0-0.job:29400");
  CHECK(pet->source == "PET_MASTER_ADDR");
  auto no_port = rendezvous_from_env(env_of({{"MASTER_ADDR", "s"}}));
  REQUIRE_FALSE(no_port);
  CHECK(describe(no_port.error()).find("MASTER_ADDR is set but neither MASTER_PORT nor ASHLAR_PORT") != std::string::npos);
  auto mine = rendezvous_from_env(env_of({{"ASHLAR_JOIN", "[fe80::1]:7400"}, {"SLURM_JOB_ID", "1"},
                                          {"MASTER_ADDR", "x"}}));
  REQUIRE(mine);
  CHECK(mine->host == "fe80::1");
  CHECK(mine->source == "ASHLAR_JOIN");
  auto nothing = rendezvous_from_env(env_of({}));
  REQUIRE_FALSE(nothing);
  CHECK(describe(nothing.error()).find("give --join HOST:PORT") != std::string::npos);
}

TEST_CASE("a job of several hosts never rendezvouses on loopback, and the refusal names the variable") {
  auto r = rendezvous_from_env(env_of({{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "n[1-3]"}}));
  REQUIRE(r);
  auto err = check_not_loopback(*r, {"127.0.1.1"});
  REQUIRE(err);
  const auto text = describe(err);
  CHECK(text.find("n1 (from SLURM_JOB_NODELIST) resolves to 127.0.1.1, this host's loopback, while the job spans 3 "
                  "hosts") != std::string::npos);
  CHECK(check_not_loopback(*r, {"::1"}));
  CHECK_FALSE(check_not_loopback(*r, {"10.1.2.3"}));
  // One host: loopback is where the scheduler is.
  auto one = rendezvous_from_env(env_of({{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "n1"}}));
  REQUIRE(one);
  CHECK_FALSE(check_not_loopback(*one, {"127.0.0.1"}));
  CHECK(is_loopback_address("::ffff:127.0.0.1"));
  CHECK_FALSE(is_loopback_address("128.0.0.1"));
}
