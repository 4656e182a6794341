// The key-value store checkpoints live in: RocksDB on disk, or memory for unit tests.
// Writes are atomic batches, so a record and the pointer to it land together or not at all.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

struct kv_batch {
  std::vector<std::pair<std::string, std::string>> puts;
  std::vector<std::string> deletes;
};

class kv_store {
public:
  virtual ~kv_store();
  /// Applies every put and delete of `b` atomically (and durably, for a disk store: the
  /// write is synced before this returns). Fails with io_error naming the store.
  [[nodiscard]] virtual caf::error write(const kv_batch& b) = 0;
  /// The value at `key`, or nothing. Fails with io_error.
  [[nodiscard]] virtual expected<std::optional<std::string>> get(const std::string& key) const = 0;
  /// Every key that starts with `prefix`, in order.
  [[nodiscard]] virtual expected<std::vector<std::string>> keys(const std::string& prefix) const = 0;
  /// Where the store is, for messages ("memory" or the directory).
  virtual std::string where() const = 0;
};

/// A store in memory (unit tests).
std::unique_ptr<kv_store> make_memory_store();

enum class open_mode { create, existing, read_only };

/// Opens the RocksDB database in directory `dir`: created if missing (create), only if
/// there (existing), or for reading while a running job holds it (read_only: writes
/// fail). Fails with io_error naming the directory (missing, corrupt), or with busy where
/// another process holds the store's lock. `name`: what messages and where() call the
/// store, where it is opened by another path (a held directory's /proc/self/fd/N/...);
/// default: `dir`.
[[nodiscard]] expected<std::unique_ptr<kv_store>> open_rocksdb_store(const std::string& dir, open_mode mode,
                                                                     const std::string& name = {});

}  // namespace ashlar
