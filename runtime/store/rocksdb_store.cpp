#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include "runtime/store/kv_store.hpp"

namespace ashlar {

namespace {

// RocksDB's own log goes to Ashlar's (at debug, but for fatal errors: the store's own
// errors already name what failed, and RocksDB logs a new store's missing directory as
// an error), not to a LOG file in the store's
// directory: a LOG file whose write failed (a full disk) makes this RocksDB (7.x) abort
// the process, on an assertion of its own, at its next log line, e.g. when the store is
// closed or the disk has room again.
// `text` with every `from` in it written as `to` (RocksDB's messages name the path the
// store was opened by).
std::string renamed(std::string text, const std::string& from, const std::string& to) {
  if (from == to || from.empty())
    return text;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

class store_logger final : public rocksdb::Logger {
public:
  explicit store_logger(std::string dir) : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), dir_(std::move(dir)) {}

  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }

  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    const bool loud = level == rocksdb::InfoLogLevel::FATAL_LEVEL;
    if (!loud && !spdlog::should_log(spdlog::level::debug))
      return;
    char line[1024];
    line[0] = '\0';
    std::vsnprintf(line, sizeof line, format, ap);
    for (size_t n = std::strlen(line); n > 0 && (line[n - 1] == '\n' || line[n - 1] == ' '); --n)
      line[n - 1] = '\0';
    if (loud)
      spdlog::warn("checkpoint store {}: {}", dir_, line);
    else
      spdlog::debug("checkpoint store {}: {}", dir_, line);
  }

private:
  std::string dir_;
};

rocksdb::Options store_options(const std::string& name, open_mode mode) {
  rocksdb::Options opts;
  opts.info_log = std::make_shared<store_logger>(name);
  opts.create_if_missing = mode == open_mode::create;
  opts.max_open_files = 64;
  // Damage is reported, not recovered around. RocksDB's default WAL recovery replays up to
  // the first bad record and drops the rest (point in time), so a log damaged in the
  // middle reopens as an older store without a word, and a resume mixes versions. Here
  // only a record torn at the very end is dropped: the write a crash interrupted, which
  // was never acknowledged (every write is synced before it counts); anything else fails
  // the open, naming the store.
  opts.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  opts.paranoid_checks = true;
  return opts;
}

// A failed write (a full disk, an I/O error) leaves the database's log writer in an error
// state that this RocksDB (7.x) must not be asked to write through again: once the disk
// has room, the next write aborts the process on an assertion of RocksDB's own (fixed in
// later RocksDB releases by refusing to write to the log after an error). So the store
// closes and reopens the database before the next write after a failure: the reopened
// one replays its log (every acknowledged write was synced) and writes through a new one.
// Reads go on meanwhile against the database in hand; a reopen waits for them. A reopen
// that fails (the disk still full: opening replays the log into a new table file) leaves
// the store open for reading only, and the next write tries a full reopen again.
class rocksdb_store final : public kv_store {
public:
  rocksdb_store(std::unique_ptr<rocksdb::DB> db, std::string dir, std::string name, open_mode mode)
    : db_(std::move(db)), dir_(std::move(dir)), name_(std::move(name)), mode_(mode) {}

  caf::error write(const kv_batch& b) override {
    rocksdb::WriteBatch batch;
    for (const auto& [k, v] : b.puts)
      batch.Put(k, v);
    for (const auto& k : b.deletes)
      batch.Delete(k);
    rocksdb::WriteOptions opts;
    opts.sync = true; // on disk before the checkpoint counts as taken
    // At most one reopen: another writer's failure may close the store again meanwhile.
    for (int attempt = 0; attempt < 2; ++attempt) {
      {
        std::shared_lock lock{mutex_};
        if (!failed_ && db_) {
          auto s = db_->Write(opts, &batch);
          if (s.ok())
            return caf::none;
          failed_ = mode_ != open_mode::read_only; // a read-only store refuses every write
          return make_error(errc::io_error, "writing to the checkpoint store " + name_ + ": " + renamed(s.ToString(), dir_, name_));
        }
      }
      if (attempt == 0) {
        std::unique_lock lock{mutex_};
        if (failed_ || !db_)
          if (auto err = reopen())
            return err;
      }
    }
    return make_error(errc::io_error, "writing to the checkpoint store " + name_
                                        + ": another write failed while it was reopened");
  }

  expected<std::optional<std::string>> get(const std::string& key) const override {
    std::shared_lock lock{mutex_};
    if (!db_)
      return closed();
    std::string value;
    auto s = db_->Get(rocksdb::ReadOptions{}, key, &value);
    if (s.IsNotFound())
      return std::optional<std::string>{};
    if (!s.ok())
      return make_error(errc::io_error, "reading " + key + " from the checkpoint store " + name_ + ": " + renamed(s.ToString(), dir_, name_));
    return std::optional<std::string>{std::move(value)};
  }

  expected<std::vector<std::string>> keys(const std::string& prefix) const override {
    std::shared_lock lock{mutex_};
    if (!db_)
      return closed();
    std::vector<std::string> out;
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator(rocksdb::ReadOptions{})};
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
      out.push_back(it->key().ToString());
    if (!it->status().ok())
      return make_error(errc::io_error, "listing the checkpoint store " + name_ + ": " + renamed(it->status().ToString(), dir_, name_));
    return out;
  }

  std::string where() const override { return name_; }

private:
  // Under the exclusive lock: closes the database and opens it again (never creating it:
  // a store whose directory is gone stays failed). Where that fails, the store is opened
  // for reading only (no disk space needed), failed_ stays set and the next write tries
  // again; only if that fails too is the store closed (reads fail, naming why).
  caf::error reopen() {
    db_.reset();
    auto opts = store_options(name_, mode_);
    opts.create_if_missing = false;
    rocksdb::DB* raw = nullptr;
    auto s = rocksdb::DB::Open(opts, dir_, &raw);
    if (s.ok()) {
      db_.reset(raw);
      failed_ = false;
      reopen_error_.clear();
      spdlog::info("checkpoint store {}: reopened after a failed write; writing again", name_);
      return caf::none;
    }
    reopen_error_ = renamed(s.ToString(), dir_, name_);
    raw = nullptr;
    if (rocksdb::DB::OpenForReadOnly(opts, dir_, &raw).ok())
      db_.reset(raw);
    failed_ = true;
    return make_error(errc::io_error, "reopening the checkpoint store " + name_ + " after a failed write: "
                                        + reopen_error_ + (db_ ? " (it stays readable; the next write tries again)"
                                                               : " (the next write tries again)"));
  }

  caf::error closed() const {
    return make_error(errc::io_error, "the checkpoint store " + name_ + " is closed: reopening it after a failed "
                                        "write failed (" + reopen_error_ + "); the next write tries again");
  }

  mutable std::shared_mutex mutex_; // shared: reads and writes; exclusive: a reopen
  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;  // what it is opened by
  std::string name_; // what messages call it
  open_mode mode_;
  std::atomic<bool> failed_{false}; // a write failed: reopen before the next
  std::string reopen_error_;
};

}  // namespace

expected<std::unique_ptr<kv_store>> open_rocksdb_store(const std::string& dir, open_mode mode,
                                                       const std::string& name) {
  const std::string shown = name.empty() ? dir : name;
  const auto opts = store_options(shown, mode);
  rocksdb::DB* raw = nullptr;
  auto s = mode == open_mode::read_only ? rocksdb::DB::OpenForReadOnly(opts, dir, &raw)
                                        : rocksdb::DB::Open(opts, dir, &raw);
  if (!s.ok()) {
    std::string why = renamed(s.ToString(), dir, shown);
    // RocksDB's LOCK held elsewhere reads "Resource temporarily unavailable" or "lock hold".
    if (why.find("/LOCK") != std::string::npos)
      return make_error(errc::busy, "cannot open the checkpoint store " + shown + ": " + why
                                      + " (the store is open elsewhere: a job or node on the same directory, or a "
                                        "node the cluster lost that still runs, frozen or cut off, which lets go "
                                        "once it notices; stop that process or use another directory)");
    return make_error(errc::io_error, "cannot open the checkpoint store " + shown + ": " + why);
  }
  return std::unique_ptr<kv_store>(new rocksdb_store(std::unique_ptr<rocksdb::DB>(raw), dir, shown, mode));
}

}  // namespace ashlar
