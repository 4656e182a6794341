// The deterministic cluster simulator's schedules: every seed's invariants hold, and the
// control-plane bugs seen on real clusters are cases here.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include "tests/sim/cluster_sim.hpp"

using namespace ashlar::sim;

namespace {

void require_ok(const sim_result& r) {
  INFO("replay: " << r.replay);
  INFO("violation: " << r.violation);
  REQUIRE(r.ok);
}

}  // namespace

// A fault the invariants must catch: the schedule `opt` breaks one (naming `violation`,
// where given) under the older rule `legacy`, and keeps every one under the current.
void old_fails_new_holds(sim_options opt, bool sim_options::*legacy, const char* violation = nullptr) {
  opt.*legacy = true;
  auto old = run(opt);
  CHECK_FALSE(old.ok);
  if (violation != nullptr)
    CHECK(old.violation.find(violation) != std::string::npos);
  opt.*legacy = false;
  require_ok(run(opt));
}

TEST_CASE("300 seeded schedules of crashes, freezes, partitions, joins, raises and stops keep every invariant") {
  int broken = 0;
  std::set<std::string> outcomes;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    sim_options opt;
    opt.seed = seed;
    auto r = run(opt);
    outcomes.insert(r.outcome.substr(0, r.outcome.find(':')));
    if (!r.ok) {
      ++broken;
      FAIL_CHECK("seed " << seed << ": " << r.violation << "\n  replay: build/tests/" << r.replay);
    }
  }
  CHECK(broken == 0);
  // The schedules reach every kind of end: trained, stopped, failed, and before the start.
  CHECK(outcomes.count("trained") == 1);
  CHECK(outcomes.count("stopped") == 1);
  CHECK(outcomes.count("failed") == 1);
  CHECK(outcomes.count("stopped while waiting for the job's nodes") == 1);
}

TEST_CASE("ashlar launch over 500 seeded schedules: every process ends soon after the job, the exit code is the job's "
          "outcome, a member lost once the job runs never fails it") {
  std::map<std::string, int> paths;
  std::set<int> codes;
  for (uint64_t seed = 1; seed <= 500; ++seed) {
    sim_options opt;
    opt.seed = seed;
    auto r = run(opt);
    if (!r.ok)
      FAIL_CHECK("seed " << seed << ": " << r.violation << "\n  replay: build/tests/" << r.replay);
    paths[r.launch_path] += 1;
    codes.insert(r.launch_code);
  }
  // Each of the launch's paths is taken by some schedules, and its codes are all seen.
  CHECK(paths["failed start"] > 0);
  CHECK(paths["interrupted"] > 0);
  CHECK(paths["lost member"] > 0);
  CHECK(paths["plain"] > 0);
  CHECK(codes.count(0) == 1);
  CHECK(codes.count(1) == 1);
  CHECK(codes.count(130) == 1);
}

TEST_CASE("the launcher that stopped the job when one worker process died breaks the invariants, and not the "
          "supervised one") {
  // The first schedule whose launch loses a member once the job runs and still trains.
  sim_options opt;
  for (opt.seed = 1; opt.seed <= 300; ++opt.seed) {
    auto r = run(opt);
    if (r.launch_path == "lost member" && r.outcome == "trained")
      break;
  }
  REQUIRE(opt.seed <= 300);
  old_fails_new_holds(opt, &sim_options::launch_stops_on_lost_member, "what happened was 'trained'");
}

TEST_CASE("a seed replays bit for bit") {
  sim_options opt;
  opt.seed = 77;
  opt.verbose = true;
  auto a = run(opt);
  auto b = run(opt);
  CHECK(a.trace == b.trace);
  CHECK(a.events == b.events);
  CHECK(a.outcome == b.outcome);
}

TEST_CASE("a storm of node losses under the old per-loss hand-over trains past 1.05x its epochs, and not with the new") {
  sim_options opt;
  opt.workers = 256;
  opt.nodes = 16;
  opt.minutes = 2;
  opt.seed = 3;
  old_fails_new_holds(opt, &sim_options::legacy_handover, "over 1.05x");
}

TEST_CASE("hand-overs that count the step in flight at the new part train past or short of the epochs, and not "
          "with directives that lead") {
  // Seeds where the version before the lead breaks the bound: 6288 trains 577 samples of
  // 512, 10764 stops at 0.96x (members finish on their old parts before the directive).
  for (uint64_t seed : {6288u, 10764u}) {
    sim_options opt;
    opt.seed = seed;
    old_fails_new_holds(opt, &sim_options::uncorrected_directives);
  }
}

TEST_CASE("a full disk under the job's record keeps its last committed cut on every shard, and not when a failed "
          "commit counted as committed") {
  // Seed 9929: the job's store is full for cuts 9 to 11; the shards write them and, told
  // that cut 11 was committed, drop cut 8, the newest the record names.
  sim_options opt;
  opt.seed = 9929;
  old_fails_new_holds(opt, &sim_options::uncommitted_cut_kept, "a resume would fail");
}

TEST_CASE("a shard's disk that was full abandons the cut it failed, and not the job's last cut after it") {
  // Seed 9653: shard 1's disk fills and empties again before the job ends; its old write
  // error abandoned the final cut before the shard wrote it.
  sim_options opt;
  opt.seed = 9653;
  old_fails_new_holds(opt, &sim_options::stale_cut_error, "last cut");
}

TEST_CASE("1,000 workers over 100 nodes with 10% of the nodes replaced every minute train their epochs once") {
  sim_options opt;
  opt.workers = 1000;
  opt.nodes = 100;
  opt.minutes = 2;
  auto r = run(opt);
  require_ok(r);
  CHECK(r.outcome == "trained");
  CHECK(r.trained_epochs / r.epochs >= 1.0);
  CHECK(r.trained_epochs / r.epochs <= 1.05);
  CHECK(r.max_workers_held <= 1000);
}

TEST_CASE("a node frozen past the heartbeat timeout is dropped, then by its own lifecycle probes, settles and joins "
          "again, and the job trains its epochs once") {
  sim_options opt;
  opt.seed = 405; // node process 2 frozen 6 s; another node crashes meanwhile
  opt.launch_faults = false;
  opt.verbose = true;
  auto r = run(opt);
  require_ok(r);
  CHECK(r.outcome == "trained");
  auto saw = [&](const std::string& text) {
    for (const auto& line : r.trace)
      if (line.find(text) != std::string::npos)
        return true;
    return false;
  };
  CHECK(saw("node 1002 lost, with 4 workers"));
  CHECK(saw("node process 2: lost the scheduler at the scheduler (its connection closed)"));
  CHECK(saw("node process 2: the scheduler at the scheduler answers"));
  CHECK(saw("node process 2: joined the scheduler at the scheduler again as node 2002"));
  CHECK(r.trained_epochs / r.epochs >= 1.0);
  CHECK(r.trained_epochs / r.epochs <= 1.05);
}

TEST_CASE("a node whose welcome is lost gets no workers, is given up on after the confirmation wait, and joins again") {
  auto trace_of = [](uint64_t seed) {
    sim_options opt;
    opt.seed = seed;
    opt.launch_faults = false;
    opt.verbose = true;
    auto r = run(opt);
    require_ok(r); // (and no worker started on a node that had not confirmed: an invariant)
    return r;
  };
  auto saw = [](const sim_result& r, const std::string& text) {
    for (const auto& line : r.trace)
      if (line.find(text) != std::string::npos)
        return true;
    return false;
  };
  // A node joins the running job, its welcome is lost: the job trains on without it.
  auto during = trace_of(2);
  CHECK(saw(during, "node 1003's welcome is lost"));
  CHECK(during.outcome == "trained");
  // Nodes whose welcomes are lost while a job waits for nodes: lost 15 s later, and they
  // join again as new nodes.
  auto waiting = trace_of(716);
  CHECK(saw(waiting, "node 1007 did not confirm its welcome in time"));
  CHECK(saw(waiting, "node 1007 lost, with 0 workers"));
  CHECK(saw(waiting, "node 2007 joined with 2 slots"));
}
