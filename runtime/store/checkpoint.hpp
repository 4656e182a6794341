// Checkpointed parameter versions of server shards, and the job's resume record, as
// Cap'n Proto records in a kv_store.
//
// Keys of a shard's store: "shard/<id>/v/<version, 20 digits>" per checkpoint and
// "shard/<id>/latest" naming the newest. A checkpoint, its LATEST pointer and the
// deletion of the ones beyond `keep` go in one atomic batch, so a crash leaves the store
// at the old or the new checkpoint, never between. Each record carries a CRC-32 over its
// identity and tensors: a corrupt or truncated record is skipped (with a warning) for the
// newest older one that checks out.
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

struct shard_checkpoint {
  uint32_t shard_id = 0;
  uint64_t version = 0;
  uint64_t begin = 0, end = 0; // the parameter range
  int64_t unix_ns = 0;         // when it was taken
  std::vector<float> params;   // end - begin floats
  std::vector<float> velocity; // momentum, end - begin floats (or empty: none yet)
};

/// What `ashlar checkpoint list` shows of one stored checkpoint.
struct checkpoint_info {
  uint32_t shard_id = 0;
  uint64_t version = 0;
  int64_t unix_ns = 0;
  uint64_t bytes = 0;
  bool intact = false;  // the record decodes and its checksum matches
  std::string problem;  // why not, if not
};

/// Encodes a record (with its checksum). `params` and `velocity` are range-sized views.
std::string encode_checkpoint(uint32_t shard_id, uint64_t version, uint64_t begin, uint64_t end, int64_t unix_ns,
                              const float* params, const float* velocity);
/// Decodes and verifies a record. Fails with corrupt_data saying what is wrong.
[[nodiscard]] expected<shard_checkpoint> decode_checkpoint(const std::string& bytes);

class checkpoint_log {
public:
  /// Checkpoints of shard `shard_id` in `store`, keeping the newest `keep` (>= 1).
  checkpoint_log(kv_store& store, uint32_t shard_id, uint32_t keep);

  /// Writes a checkpoint of version `version` atomically with the LATEST pointer, and
  /// deletes the ones beyond `keep`. Returns the record's size in bytes.
  [[nodiscard]] expected<uint64_t> save(uint64_t version, uint64_t begin, uint64_t end, const float* params,
                                        const float* velocity);

  /// The newest intact checkpoint, or nothing when none is stored. A corrupt newer one
  /// is skipped with a warning naming its version and the problem.
  [[nodiscard]] expected<std::optional<shard_checkpoint>> load_latest() const;

  /// Every stored checkpoint, oldest first, each checked.
  [[nodiscard]] expected<std::vector<checkpoint_info>> list() const;

  /// One stored checkpoint by version (checked). Fails with invalid_argument if absent.
  [[nodiscard]] expected<shard_checkpoint> load(uint64_t version) const;

private:
  std::string key(uint64_t version) const;
  kv_store* store_;
  uint32_t shard_id_;
  uint32_t keep_;
};

/// Writes a shard's checkpoints on a thread of its own, so the shard goes on serving
/// while RocksDB syncs. The shard hands over a version (its immutable parameter buffer
/// and a copy of the velocity); while a write is in progress the newest handed-over
/// version waits, replacing any older one still waiting, so a store slower than the
/// checkpoint rate skips versions instead of holding training back.
class async_checkpointer {
public:
  async_checkpointer(kv_store& store, uint32_t shard_id, uint32_t keep);
  ~async_checkpointer(); // finishes the waiting write, then stops
  async_checkpointer(const async_checkpointer&) = delete;
  async_checkpointer& operator=(const async_checkpointer&) = delete;

  /// Hands over `version` for writing.
  void submit(uint64_t version, uint64_t begin, uint64_t end, std::shared_ptr<const std::vector<float>> params,
              std::vector<float> velocity);
  /// Waits until everything handed over is written. Returns the newest version on disk.
  uint64_t flush();

  struct totals {
    uint64_t written = 0, skipped = 0, bytes = 0, failures = 0;
    double seconds = 0; // spent writing
    uint64_t newest = 0;
  };
  totals stats() const;

private:
  struct job {
    uint64_t version = 0, begin = 0, end = 0;
    std::shared_ptr<const std::vector<float>> params;
    std::vector<float> velocity;
  };
  void run();
  checkpoint_log log_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<job> waiting_;
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
};

/// Writes the job's record (key "job"), stamped now unless r.unix_ns is set.
[[nodiscard]] caf::error save_job_record(kv_store& store, const job_record& r);
/// Reads it; nothing if the store has none. Fails with corrupt_data if it does not decode.
[[nodiscard]] expected<std::optional<job_record>> load_job_record(const kv_store& store);

}  // namespace ashlar
