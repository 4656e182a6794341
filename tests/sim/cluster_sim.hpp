// A deterministic simulator of an Ashlar cluster's control plane: one thread, simulated
// time and network, the real control-plane machines (runtime/control: the job's
// lifecycle, the cluster's membership, the plan of membership changes, each node's
// lifecycle, the start barrier) driving simulated nodes, a BSP shard, and workers that run
// the real step machine (runtime/worker/step_machine.hpp) with a paced delay for their
// compute: their data parts, directives, corrections and reports are the worker's own. A seed
// draws a schedule of faults (a node crashed, frozen and thawed, partitioned and healed,
// nodes joining, a node asking for 100000 slots, a script that raises, a stop, a shutdown
// while the job waits, a disk that fills for a while under a shard's checkpoints or the
// job's record); after every event the invariants are checked, and the first one broken
// ends the run with a replay command. Checkpoint cuts run on the real cut_pacer (the job
// driver's), cut_schedule and checkpoint_log (each shard's) and job record, on stores in
// memory: a committed cut is one version on every shard, the newest committed cut stays
// intact everywhere (a resume starts from it), and where every disk had room the job's
// last cut goes in. The scheduler's and the first worker nodes' processes are an `ashlar
// launch`'s, supervised by the real launch_supervisor: a member exits before the job has
// its members, dies once it runs, or the launcher gets Ctrl-C; every process ends soon
// after the job, and the launch's exit code is the job's outcome.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ashlar::sim {

/// What one simulated run is made of. Everything else follows from `seed`.
struct sim_options {
  uint64_t seed = 1;
  /// Scale runs (the storm benchmark): this many workers over `nodes` nodes, every
  /// simulated minute 10% of the nodes crash and as many join; 0: a seeded small schedule.
  uint32_t workers = 0;
  uint32_t nodes = 0;
  double minutes = 0;
  /// Scale runs: seconds between two waves of losses and joins, the nodes each wave
  /// replaces (0: 10% of them), and how long a joining node takes to say hello.
  double period_s = 60;
  uint32_t churn = 0;
  double join_delay_s = 0;
  /// Print each event as it happens.
  bool verbose = false;
  /// The hand-over of the version before the lockstep fix (one rounded-up round per loss):
  /// for showing that the invariant catches it.
  bool legacy_handover = false;
  /// The version before directives had a lead: a plan counts every step a member has left
  /// at its new part, the member moves to it at once and takes the steps as they are,
  /// though the steps it took since the profiler counted trained its old part: for showing
  /// that the invariant catches it.
  bool uncorrected_directives = false;
  /// The version before a failed commit was rolled back: a cut whose job record could not
  /// be written (a full disk) counted as committed, and the shards kept it instead of the
  /// one the record names: for showing that the invariant catches it.
  bool uncommitted_cut_kept = false;
  /// The version before a new cut cleared a shard's write error: a write that failed on a
  /// full disk abandoned every later cut at once, until one was written anyway: for showing
  /// that the invariant catches it.
  bool stale_cut_error = false;
  /// The launcher before its supervision (runtime/control/launch_supervisor.hpp): a worker
  /// process that died once the job ran stopped the job: for showing that the invariant
  /// catches it.
  bool launch_stops_on_lost_member = false;
  /// The launch's own faults (a member that exits before the start, a Ctrl-C, a shutdown
  /// while the job trains), drawn apart from the schedule's; off for a scenario a test
  /// picked by its seed.
  bool launch_faults = true;
};

struct sim_result {
  bool ok = true;
  std::string violation;    ///< the first invariant broken, and when
  std::string outcome;      ///< the job's outcome as its lifecycle said it
  std::string expected;     ///< what the schedule made true ("trained", "failed: ...")
  double trained_epochs = 0;///< samples applied / training set
  uint32_t epochs = 0;
  double end_s = 0;         ///< simulated seconds at the job's end
  uint64_t events = 0;
  uint64_t control_work = 0;///< messages the scheduler sent and members it looked at
  uint64_t rounds = 0;
  uint32_t max_workers_held = 0;
  std::vector<std::string> trace; ///< the events, when verbose
  std::string replay;       ///< the command that replays this run exactly
  /// `ashlar launch` over the run (seeded schedules): its exit code, and which of its paths
  /// the schedule took: "failed start" (a member exited before the job had its members),
  /// "interrupted" (Ctrl-C), "lost member" (a member process died once the job ran), or
  /// "plain"; "" for a scale run.
  int launch_code = 0;
  std::string launch_path;
};

sim_result run(const sim_options& opt);

}  // namespace ashlar::sim
