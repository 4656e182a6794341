// Checkpointed parameter versions of server shards, and the job's resume record, as
// Cap'n Proto records in a kv_store.
//
// A checkpoint is one cut of the whole job: the job driver asks every shard to write
// checkpoint cut N (each at its version then, or all at one version under lockstep
// policies), and once every shard has it on disk, writes the job's record of cut N (its
// samples, members' batch shares and data positions). A resume takes the newest cut that
// the job record and every shard hold intact (see choose_cut in job_store.hpp).
//
// Keys of a shard's store: "shard/<id>/c/<cut, 20 digits>" per cut, and "shard/<id>/stop"
// for the record a shard writes when its node stops it mid-job (not part of any cut: a
// shard served again mid-job restores whichever of the two is newer). A record and the
// deletion of the cuts beyond `keep` go in one atomic batch. Each record carries a CRC-32
// over its identity and tensors: a corrupt or truncated record is never restored.
//
// Each record also carries its format (checkpoint_format, job_record_format): a record in a
// format newer than this build knows fails every read with unsupported_format, naming it,
// instead of being passed over as corrupt. A resume by an older build would otherwise fall
// back to an older cut and then delete the newer ones it could not read.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/store/kv_store.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar {

/// The format of the shard checkpoint records this build writes, and the newest it reads.
/// Raise it with a change an older reader would misread or silently drop; records stamped
/// 0 (written before formats were stamped) read as format 1.
inline constexpr uint32_t checkpoint_format = 1;
/// The same for the job's records of committed cuts.
inline constexpr uint32_t job_record_format = 1;

struct shard_checkpoint {
  uint32_t shard_id = 0;
  uint64_t version = 0;
  uint64_t cut = 0;            // the job's cut (0: the shard's stop record)
  uint64_t begin = 0, end = 0; // the parameter range
  int64_t unix_ns = 0;         // when it was taken
  std::vector<float> params;   // end - begin floats
  std::vector<float> velocity; // momentum, end - begin floats (or empty: none yet)
  /// The running average of the parameters (train.average_epochs), end - begin floats,
  /// or empty: the shard keeps none (or the record predates it).
  std::vector<float> average;
  uint64_t average_samples = 0; // the samples the average has taken in since it (re)started
};

/// What `ashlar checkpoint list` shows of one stored checkpoint.
struct checkpoint_info {
  uint32_t shard_id = 0;
  uint64_t version = 0;
  uint64_t cut = 0;     // 0: the stop record
  int64_t unix_ns = 0;
  uint64_t bytes = 0;
  bool intact = false;  // the record decodes and its checksum matches
  std::string problem;  // why not, if not
  bool newer_format = false; // not intact because its format is newer than this build reads
};

/// Encodes a record (with its checksum). `params`, `velocity` and `average` are
/// range-sized views; `velocity` and `average` may be null (none kept).
std::string encode_checkpoint(uint32_t shard_id, uint64_t version, uint64_t cut, uint64_t begin, uint64_t end,
                              int64_t unix_ns, const float* params, const float* velocity,
                              const float* average = nullptr, uint64_t average_samples = 0);
/// Decodes and verifies a record. Fails with corrupt_data saying what is wrong, or with
/// unsupported_format for a record in a format newer than checkpoint_format.
[[nodiscard]] expected<shard_checkpoint> decode_checkpoint(const std::string& bytes);

class checkpoint_log {
public:
  /// Checkpoints of shard `shard_id` in `store`, keeping the newest `keep` cuts (>= 1).
  checkpoint_log(kv_store& store, uint32_t shard_id, uint32_t keep);

  /// Writes version `version` as cut `cut` (0: the stop record) and deletes the cuts
  /// beyond `keep`, atomically, except cut `kept` (the job's last committed cut: a resume
  /// and a shard served again go back to it, however many cuts after it were abandoned;
  /// 0 = none). Returns the record's size in bytes.
  [[nodiscard]] expected<uint64_t> save(uint64_t version, uint64_t cut, uint64_t begin, uint64_t end,
                                        const float* params, const float* velocity, const float* average = nullptr,
                                        uint64_t average_samples = 0, uint64_t kept = 0);

  /// What a shard served again mid-job restores: the newest intact record, the stop
  /// record or a cut, whichever holds the later version; nothing when none is stored.
  /// Records that do not check out are skipped with a warning naming them; one in a newer
  /// format fails the load.
  [[nodiscard]] expected<std::optional<shard_checkpoint>> load_latest() const;

  /// Every stored record, cuts oldest first and then the stop record, each checked.
  [[nodiscard]] expected<std::vector<checkpoint_info>> list() const;

  /// The cuts whose records check out, oldest first. Fails with unsupported_format if
  /// any record is in a newer format (a resume must not pass over it).
  [[nodiscard]] expected<std::vector<uint64_t>> intact_cuts() const;

  /// The record of cut `cut` (checked). Fails with invalid_argument if absent.
  [[nodiscard]] expected<shard_checkpoint> load(uint64_t cut) const;

  /// Deletes the records a resume from cut `cut` leaves behind: later cuts (written but
  /// never committed by the job record) and the stop record.
  [[nodiscard]] caf::error discard_after(uint64_t cut);

private:
  std::string key(uint64_t cut) const;
  std::string prefix() const;
  kv_store* store_;
  uint32_t shard_id_;
  uint32_t keep_;
};

/// Writes a shard's checkpoints on a thread of its own, so the shard goes on serving
/// while RocksDB syncs. The shard hands over a version (its immutable parameter buffer
/// and a copy of the velocity); while a write is in progress the newest handed-over
/// version waits, replacing any older one still waiting, so a store slower than the
/// checkpoint rate skips versions instead of holding training back. (The job driver
/// asks for one cut at a time, so a cut is replaced only by a stop record.)
class async_checkpointer {
public:
  async_checkpointer(kv_store& store, uint32_t shard_id, uint32_t keep);
  ~async_checkpointer(); // finishes the waiting write, then stops
  async_checkpointer(const async_checkpointer&) = delete;
  async_checkpointer& operator=(const async_checkpointer&) = delete;

  /// Hands over `version` for writing as cut `cut` (0: the stop record), with the
  /// running average of the parameters where the shard keeps one (else empty).
  void submit(uint64_t version, uint64_t cut, uint64_t begin, uint64_t end,
              wire::shared_tensor params, std::vector<float> velocity,
              std::vector<float> average = {}, uint64_t average_samples = 0);
  /// Waits until everything handed over is written. Returns the newest version on disk.
  uint64_t flush();

  /// The job's last committed cut, which the writes from now on keep (checkpoint_log::save).
  void keep_cut(uint64_t cut);
  /// A new cut was asked for: the failure of an earlier write (a disk that was full) no
  /// longer says anything about it; totals().error is the new cut's from now on.
  void new_cut();
  uint64_t kept_cut() const;

  struct totals {
    uint64_t written = 0, skipped = 0, bytes = 0, failures = 0;
    double seconds = 0; // spent writing
    uint64_t newest = 0;     // the newest version on disk
    uint64_t newest_cut = 0; // the newest cut on disk
    std::string error;       // why the last write failed ("" once one succeeds)
  };
  totals stats() const;

private:
  struct job {
    uint64_t version = 0, cut = 0, begin = 0, end = 0;
    wire::shared_tensor params;
    std::vector<float> velocity;
    std::vector<float> average;
    uint64_t average_samples = 0;
  };
  void run();
  checkpoint_log log_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<job> waiting_;
  uint64_t kept_ = 0; // keep_cut
  bool busy_ = false, stop_ = false;
  totals totals_;
  std::thread thread_;
};

/// The shard ids that have checkpoints in `store`.
[[nodiscard]] expected<std::vector<uint32_t>> stored_shards(const kv_store& store);

struct job_record {
  std::vector<std::string> settings; // "key=value"
  uint64_t samples = 0;
  double seconds = 0;
  int64_t unix_ns = 0;
  uint32_t resumes = 0;
  std::string stage; // the training stage in force (ASHL), or ""
  /// The members as last reported: batch share, data position, samples trained.
  struct worker {
    uint32_t id = 0;
    uint32_t batch = 0;
    wire::data_position position;
    uint64_t samples = 0;
  };
  std::vector<worker> workers;
  uint64_t cut = 0; // the checkpoint cut every shard wrote for this record
};

/// Commits cut r.cut: writes the job's record of it (key "cut/<20 digits>"), stamped now
/// unless r.unix_ns is set, and deletes the cut records beyond `keep`, in one atomic batch.
[[nodiscard]] caf::error save_job_record(kv_store& store, const job_record& r, uint32_t keep = 3);
/// The records of the committed cuts, newest first; one that does not decode is left
/// out with a warning naming it. Fails with unsupported_format if one is in a newer format.
[[nodiscard]] expected<std::vector<job_record>> load_job_cuts(const kv_store& store);
/// The newest intact record; nothing if the store has none.
[[nodiscard]] expected<std::optional<job_record>> load_job_record(const kv_store& store);
/// Deletes the records of cuts after `cut` (a resume from `cut` writes them anew).
[[nodiscard]] caf::error discard_job_cuts_after(kv_store& store, uint64_t cut);

}  // namespace ashlar
