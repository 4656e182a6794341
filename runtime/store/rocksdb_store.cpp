#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include "runtime/store/kv_store.hpp"

namespace ashlar {

namespace {

class rocksdb_store final : public kv_store {
public:
  rocksdb_store(std::unique_ptr<rocksdb::DB> db, std::string dir) : db_(std::move(db)), dir_(std::move(dir)) {}

  caf::error write(const kv_batch& b) override {
    rocksdb::WriteBatch batch;
    for (const auto& [k, v] : b.puts)
      batch.Put(k, v);
    for (const auto& k : b.deletes)
      batch.Delete(k);
    rocksdb::WriteOptions opts;
    opts.sync = true; // on disk before the checkpoint counts as taken
    auto s = db_->Write(opts, &batch);
    if (!s.ok())
      return make_error(errc::io_error, "writing to the checkpoint store " + dir_ + ": " + s.ToString());
    return caf::none;
  }

  expected<std::optional<std::string>> get(const std::string& key) const override {
    std::string value;
    auto s = db_->Get(rocksdb::ReadOptions{}, key, &value);
    if (s.IsNotFound())
      return std::optional<std::string>{};
    if (!s.ok())
      return make_error(errc::io_error, "reading " + key + " from the checkpoint store " + dir_ + ": " + s.ToString());
    return std::optional<std::string>{std::move(value)};
  }

  expected<std::vector<std::string>> keys(const std::string& prefix) const override {
    std::vector<std::string> out;
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator(rocksdb::ReadOptions{})};
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
      out.push_back(it->key().ToString());
    if (!it->status().ok())
      return make_error(errc::io_error, "listing the checkpoint store " + dir_ + ": " + it->status().ToString());
    return out;
  }

  std::string where() const override { return dir_; }

private:
  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;
};

}  // namespace

expected<std::unique_ptr<kv_store>> open_rocksdb_store(const std::string& dir, open_mode mode) {
  rocksdb::Options opts;
  opts.create_if_missing = mode == open_mode::create;
  opts.max_open_files = 64;
  opts.keep_log_file_num = 2;
  // Damage is reported, not recovered around. RocksDB's default WAL recovery replays up to
  // the first bad record and drops the rest (point in time), so a log damaged in the
  // middle reopens as an older store without a word, and a resume mixes versions. Here
  // only a record torn at the very end is dropped: the write a crash interrupted, which
  // was never acknowledged (every write is synced before it counts); anything else fails
  // the open, naming the store.
  opts.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  opts.paranoid_checks = true;
  rocksdb::DB* raw = nullptr;
  auto s = mode == open_mode::read_only ? rocksdb::DB::OpenForReadOnly(opts, dir, &raw)
                                        : rocksdb::DB::Open(opts, dir, &raw);
  if (!s.ok())
    return make_error(errc::io_error, "cannot open the checkpoint store " + dir + ": " + s.ToString());
  return std::unique_ptr<kv_store>(new rocksdb_store(std::unique_ptr<rocksdb::DB>(raw), dir));
}

}  // namespace ashlar
