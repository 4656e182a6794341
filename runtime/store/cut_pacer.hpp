// When the job takes a checkpoint cut, and when one is done: the job driver shows it the
// shards' versions and the cuts they have on disk; it answers what to do next.
//
// One cut is in flight at a time. A cut starts once shard 0 has made `every` versions
// since the last one started. Under a lockstep policy every shard writes one version a
// few rounds past the newest it reported (the same round on every shard: an exact cut of
// the model); a shard already past it when asked refuses, the cut is abandoned, and the
// next one looks twice as far ahead. Otherwise each writes the version it is at when
// asked. The cut is
// done (the job record may name it) when every shard reports it on disk; it is abandoned
// when a shard reports a failed write, a shard is lost, or it takes longer than the
// timeout. Ids are never reused within a run: a late write of an abandoned cut can never
// pass for the next one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ashlar {

/// What one shard's status says about checkpoints.
struct shard_cut_view {
  uint64_t version = 0;
  uint64_t cut = 0;       // the newest cut on disk
  std::string error;      // why its last write failed, or ""
};

struct cut_action {
  enum kind_t { none, start, commit, abandon } kind = none;
  uint64_t cut = 0;
  uint64_t at_version = 0; // start: the version every shard writes (0: each its current one)
  std::string why;         // abandon: what went wrong
};

class cut_pacer {
public:
  /// `every`: versions of shard 0 between cuts (0: only the final one); `last_committed`:
  /// the cut the job started from (0: none); `timeout_s`: how long a cut may take.
  cut_pacer(uint64_t every, bool lockstep, uint64_t last_committed, double timeout_s = 120);

  /// The next step, given every shard's status at `now` (seconds).
  cut_action on_status(const std::vector<shard_cut_view>& shards, double now);
  /// The last cut of a job that ends: starts now at each shard's current version,
  /// replacing one in flight.
  cut_action final_cut(double now);
  /// A shard was lost: a cut in flight is abandoned (it would never complete).
  std::optional<cut_action> shard_lost();
  /// A shard could not take cut `cut` (it was past the cut's version when asked): the
  /// cut is abandoned and later ones look twice as many rounds ahead. Nothing when
  /// `cut` is not in flight.
  std::optional<cut_action> missed(uint64_t cut, const std::string& why);
  /// The job's record of cut `cut`, just committed, could not be written (a full disk):
  /// the last committed cut is the one before it again, which the shards keep (a resume
  /// goes back to what the record names). Nothing when `cut` is not the last committed.
  void commit_failed(uint64_t cut);
  /// How many rounds past the newest reported version a lockstep cut is taken.
  uint64_t margin() const { return margin_; }

  std::optional<uint64_t> in_flight() const;
  uint64_t last_committed() const { return last_committed_; }

private:
  cut_action begin(uint64_t at_version, double now);
  uint64_t every_;
  bool lockstep_;
  uint64_t last_committed_;
  uint64_t committed_before_ = 0; // the last committed cut before the newest commit
  uint64_t next_;
  double timeout_s_;
  uint64_t margin_ = 2;
  std::optional<uint64_t> base_; // shard 0's version when the last cut started
  struct flight {
    uint64_t cut = 0;
    double since = 0;
  };
  std::optional<flight> flight_;
};

}  // namespace ashlar
