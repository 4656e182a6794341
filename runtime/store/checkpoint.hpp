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

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/store/kv_store.hpp"

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

/// The shard ids that have checkpoints in `store`.
[[nodiscard]] expected<std::vector<uint32_t>> stored_shards(const kv_store& store);

struct job_record {
  std::vector<std::string> settings; // "key=value"
  uint64_t samples = 0;
  double seconds = 0;
  int64_t unix_ns = 0;
  std::string stage;
  uint32_t resumes = 0;
};

/// Writes the job's record (key "job"), stamped now unless r.unix_ns is set.
[[nodiscard]] caf::error save_job_record(kv_store& store, const job_record& r);
/// Reads it; nothing if the store has none. Fails with corrupt_data if it does not decode.
[[nodiscard]] expected<std::optional<job_record>> load_job_record(const kv_store& store);

}  // namespace ashlar
