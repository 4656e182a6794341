// A job's checkpoint cuts, from the job driver's side: the cut a resume starts from
// (agreed with every shard and restored in each), the cuts taken while the job runs
// (paced by runtime/store/cut_pacer.hpp, each committed to the job record once every
// shard has it on disk), and the last one at the end.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <caf/scoped_actor.hpp>

#include "actors/interfaces.hpp"
#include "runtime/store/cut_pacer.hpp"
#include "runtime/store/job_store.hpp"

namespace ashlar::actors {

/// What the job record of a cut holds besides the cut: the job's progress when it began.
struct cut_progress {
  uint64_t samples = 0;
  double seconds = 0;
  std::vector<wire::worker_stats> workers;
  std::string stage;
};

class job_checkpoints {
public:
  job_checkpoints(caf::scoped_actor& self, job_store& store, const std::string& dir, uint64_t every, bool lockstep);

  /// Before training: asks every shard which cuts it holds intact, chooses the newest the
  /// job record names too (choose_cut), restores it in each shard and adopts it. Fails in
  /// one line naming the shard and what it lacks; never restores a mix.
  [[nodiscard]] caf::error take_up(const std::vector<shard_actor>& shards);

  /// Every driver tick: polls the shards (at most every 100 ms) and starts, commits or
  /// abandons a cut. `progress` gives what the record of a cut started now holds (asked
  /// only when one starts).
  void tick(const std::vector<shard_actor>& shards, double now, const std::function<cut_progress()>& progress);

  /// A shard was lost: the cut in flight (if any) is abandoned.
  void shard_lost();

  /// A lost shard is served again, restored from its own newest intact cut, which may be
  /// one the job record never committed (the cut in flight when its node was lost): it goes
  /// back to the last committed cut, so shards lost together (a frozen scheduler loses every
  /// node) hold one cut again, never a mix. Nothing when no cut is committed yet.
  [[nodiscard]] caf::error realign(const shard_actor& shard, uint32_t shard_id);

  /// The job ends: the last cut at every shard's current version, waited for (up to 60 s)
  /// and committed with `progress`. Errors are logged: the cuts before it stand.
  void final_cut(const std::vector<shard_actor>& shards, double now, const cut_progress& progress);

  /// The cuts abandoned so far, each with its cause ("cut 4: shard 1: No space left on
  /// device"), for the job's report.
  const std::vector<std::string>& abandoned() const { return abandoned_; }

private:
  std::optional<std::vector<shard_cut_view>> poll(const std::vector<shard_actor>& shards);
  void act(const cut_action& a, const std::vector<shard_actor>& shards,
           const std::function<cut_progress()>& progress);

  caf::scoped_actor& self_;
  job_store& store_;
  std::string dir_;
  uint64_t every_;
  bool lockstep_;
  std::optional<cut_pacer> pacer_;
  cut_progress pending_; // the record of the cut in flight
  double last_poll_ = -1;
  std::vector<std::string> abandoned_;
};

}  // namespace ashlar::actors
