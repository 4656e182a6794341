// ashlar-sim: one run of the deterministic cluster simulator (tests/sim/cluster_sim.hpp),
// to replay a seed a test named, or to measure the control plane's work under a storm.
//   ashlar-sim --seed 17 --verbose        # replay seed 17 and print its events
//   ashlar-sim --seeds 10000              # seeds 1..N, a line per failing one
//   ashlar-sim --workers 10000 --nodes 1000 --minutes 3
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/sim/cluster_sim.hpp"

int main(int argc, char** argv) {
  ashlar::sim::sim_options opt;
  uint64_t seeds = 0;
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* name) { return std::strcmp(argv[i], name) == 0 && i + 1 < argc; };
    if (arg("--seed"))
      opt.seed = std::strtoull(argv[++i], nullptr, 10);
    else if (arg("--seeds"))
      seeds = std::strtoull(argv[++i], nullptr, 10);
    else if (arg("--workers"))
      opt.workers = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else if (arg("--nodes"))
      opt.nodes = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else if (arg("--minutes"))
      opt.minutes = std::strtod(argv[++i], nullptr);
    else if (arg("--period"))
      opt.period_s = std::strtod(argv[++i], nullptr);
    else if (arg("--churn"))
      opt.churn = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else if (arg("--join-delay"))
      opt.join_delay_s = std::strtod(argv[++i], nullptr);
    else if (std::strcmp(argv[i], "--verbose") == 0)
      opt.verbose = true;
    else if (std::strcmp(argv[i], "--legacy-handover") == 0)
      opt.legacy_handover = true;
    else if (std::strcmp(argv[i], "--uncorrected-directives") == 0)
      opt.uncorrected_directives = true;
    else if (std::strcmp(argv[i], "--uncommitted-cut-kept") == 0)
      opt.uncommitted_cut_kept = true;
    else if (std::strcmp(argv[i], "--stale-cut-error") == 0)
      opt.stale_cut_error = true;
    else if (std::strcmp(argv[i], "--launch-stops-on-lost-member") == 0)
      opt.launch_stops_on_lost_member = true;
    else if (std::strcmp(argv[i], "--no-launch-faults") == 0)
      opt.launch_faults = false;
    else {
      std::fprintf(stderr, "ashlar-sim: unknown argument %s\nusage: ashlar-sim [--seed N | --seeds N] [--workers W "
                           "--nodes K --minutes M [--period S] [--churn K] [--join-delay S]] [--verbose] [--legacy-handover] [--uncorrected-directives] [--uncommitted-cut-kept] [--stale-cut-error] [--launch-stops-on-lost-member] [--no-launch-faults]\n", argv[i]);
      return 2;
    }
  }
  if (opt.workers > 0 && opt.minutes <= 0)
    opt.minutes = 3;
  if (seeds > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t bad = 0;
    for (uint64_t s = 1; s <= seeds; ++s) {
      opt.seed = s;
      auto r = ashlar::sim::run(opt);
      if (!r.ok) {
        ++bad;
        std::printf("seed %llu: %s\n  replay: %s\n", static_cast<unsigned long long>(s), r.violation.c_str(),
                    r.replay.c_str());
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%llu seeds, %llu invariant violations, %.1f s\n", static_cast<unsigned long long>(seeds),
                static_cast<unsigned long long>(bad), secs);
    return bad == 0 ? 0 : 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ashlar::sim::run(opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& line : r.trace)
    std::printf("%s\n", line.c_str());
  std::printf("seed %llu: %s; the job ended '%s' (what happened: '%s') at %.1f simulated s, %.3f epochs of %u "
              "trained, %llu events, %llu rounds\n",
              static_cast<unsigned long long>(opt.seed), r.ok ? "invariants held" : r.violation.c_str(),
              r.outcome.c_str(), r.expected.c_str(), r.end_s, r.trained_epochs, r.epochs,
              static_cast<unsigned long long>(r.events), static_cast<unsigned long long>(r.rounds));
  if (!r.launch_path.empty())
    std::printf("ashlar launch: %s, exit code %d\n", r.launch_path.c_str(), r.launch_code);
  if (opt.workers > 0)
    std::printf("control work: %llu (%.2f per round, %.4f per round per worker); at most %u workers held; %.2f s of "
                "this machine\n",
                static_cast<unsigned long long>(r.control_work),
                r.rounds ? static_cast<double>(r.control_work) / static_cast<double>(r.rounds) : 0.0,
                r.rounds ? static_cast<double>(r.control_work) / static_cast<double>(r.rounds) / opt.workers : 0.0,
                r.max_workers_held, secs);
  return r.ok ? 0 : 1;
}
