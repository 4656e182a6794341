// Checkpoint records and the stores they live in: memory, and RocksDB on disk for real.
#include <catch2/catch.hpp>

#include <numeric>
#include <fstream>
#include <filesystem>
#include <unistd.h>
#include <sys/wait.h>

#include "runtime/config/train_config.hpp"
#include "runtime/store/checkpoint.hpp"
#include "runtime/store/job_store.hpp"
#include "runtime/store/kv_store.hpp"
#include "temp_dir.hpp"

using namespace ashlar;

namespace {

std::vector<float> ramp(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Saves versions 1..n of shard 2 (range [100, 110)), params = ramp(version).
void save_versions(checkpoint_log& log, uint64_t n) {
  for (uint64_t v = 1; v <= n; ++v) {
    auto p = ramp(10, static_cast<float>(v));
    auto m = ramp(10, -static_cast<float>(v));
    REQUIRE(log.save(v, 100, 110, p.data(), m.data()));
  }
}

}  // namespace

TEST_CASE("a checkpoint round-trips through its record, and a flipped byte or a cut record is refused") {
  auto p = ramp(10, 1.5f);
  auto m = ramp(10, -3.0f);
  auto bytes = encode_checkpoint(4, 77, 20, 30, 123, p.data(), m.data());
  auto c = decode_checkpoint(bytes);
  REQUIRE(c);
  CHECK(c->shard_id == 4);
  CHECK(c->version == 77);
  CHECK(c->begin == 20);
  CHECK(c->end == 30);
  CHECK(c->unix_ns == 123);
  CHECK(c->params == p);
  CHECK(c->velocity == m);
  // A bit flipped in the tensors: the checksum catches it.
  auto flipped = bytes;
  flipped[bytes.size() - 20] ^= 0x10;
  auto bad = decode_checkpoint(flipped);
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), errc::corrupt_data));
  // Cut short: not a whole record.
  auto cut = decode_checkpoint(bytes.substr(0, bytes.size() / 2));
  REQUIRE_FALSE(cut);
  CHECK(is(cut.error(), errc::corrupt_data));
  CHECK_FALSE(decode_checkpoint(std::string(64, '\0')));
}

TEST_CASE("a checkpoint log keeps the newest N, points LATEST at the newest, and loads it") {
  auto store = make_memory_store();
  checkpoint_log log{*store, 2, 3};
  auto none = log.load_latest();
  REQUIRE(none);
  CHECK_FALSE(none->has_value());
  save_versions(log, 5);
  auto list = log.list();
  REQUIRE(list);
  REQUIRE(list->size() == 3);
  CHECK((*list)[0].version == 3);
  CHECK((*list)[2].version == 5);
  for (const auto& i : *list)
    CHECK(i.intact);
  auto latest = store->get("shard/2/latest");
  REQUIRE(latest);
  CHECK(**latest == "5");
  auto c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->version == 5);
  CHECK((*c)->params == ramp(10, 5.0f));
  CHECK((*c)->velocity == ramp(10, -5.0f));
  auto shards = stored_shards(*store);
  REQUIRE(shards);
  CHECK(*shards == std::vector<uint32_t>{2});
}

TEST_CASE("a corrupt or truncated newest checkpoint falls back to the one before it") {
  auto store = make_memory_store();
  checkpoint_log log{*store, 2, 3};
  save_versions(log, 4);
  // Corrupt version 4 in place (as a bad disk would), then truncate version 3 too.
  auto v4 = store->get("shard/2/v/00000000000000000004");
  REQUIRE(v4);
  REQUIRE(v4->has_value());
  auto bad = **v4;
  bad[bad.size() / 2] ^= 0x01;
  REQUIRE_FALSE(store->write({{{"shard/2/v/00000000000000000004", bad}}, {}}));
  auto c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->version == 3);
  auto v3 = store->get("shard/2/v/00000000000000000003");
  REQUIRE_FALSE(store->write({{{"shard/2/v/00000000000000000003", (**v3).substr(0, 40)}}, {}}));
  c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->version == 2);
  auto list = log.list();
  REQUIRE(list);
  REQUIRE(list->size() == 3);
  CHECK((*list)[0].intact);
  CHECK_FALSE((*list)[1].intact);
  CHECK_FALSE((*list)[2].intact);
  CHECK((*list)[2].problem.find("checksum") != std::string::npos);
}

TEST_CASE("RocksDB keeps checkpoints and the job record (members' shares and data positions) on disk across a reopen, and a second opener is refused naming the directory") {
  ashlar::test::temp_dir dir;
  const auto path = dir.file("store");
  {
    auto store = open_rocksdb_store(path, open_mode::create);
    REQUIRE(store);
    checkpoint_log log{**store, 2, 2};
    save_versions(log, 3);
    job_record r;
    r.settings = {"train.policy=bsp", "model.hidden=256,128"};
    r.samples = 12345;
    r.seconds = 6.5;
    r.resumes = 1;
    r.stage = "shl";
    r.workers = {{0, 40, {0, 15000, 77, 2, 640}, 31000}, {3, 88, {15000, 45000, 78, 1, 64}, 90000}};
    REQUIRE_FALSE(save_job_record(**store, r));
    auto again = open_rocksdb_store(path, open_mode::create); // the first still holds the lock
    REQUIRE_FALSE(again);
    CHECK(describe(again.error()).find(path) != std::string::npos);
  }
  auto store = open_rocksdb_store(path, open_mode::existing);
  REQUIRE(store);
  checkpoint_log log{**store, 2, 2};
  auto c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->version == 3);
  CHECK((*c)->params == ramp(10, 3.0f));
  auto list = log.list();
  REQUIRE(list);
  CHECK(list->size() == 2);
  auto job = load_job_record(**store);
  REQUIRE(job);
  REQUIRE(job->has_value());
  CHECK((*job)->samples == 12345);
  CHECK((*job)->settings.size() == 2);
  CHECK((*job)->resumes == 1);
  CHECK((*job)->stage == "shl");
  REQUIRE((*job)->workers.size() == 2);
  const auto& w = (*job)->workers[1];
  CHECK(w.id == 3);
  CHECK(w.batch == 88);
  CHECK(w.position.begin == 15000);
  CHECK(w.position.count == 45000);
  CHECK(w.position.seed == 78);
  CHECK(w.position.epoch == 1);
  CHECK(w.position.pos == 64);
  CHECK(w.samples == 90000);
  auto missing = open_rocksdb_store(dir.file("absent"), open_mode::existing);
  REQUIRE_FALSE(missing);
  CHECK(describe(missing.error()).find("absent") != std::string::npos);
}

TEST_CASE("a checkpoint record with an empty parameter tensor decodes to an error, not a crash (fuzz regression)") {
  // tests/fuzz/regressions/files-checkpoint-empty-range without its selector byte.
  const unsigned char bytes[] = {0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, 0x0a, 0x24};
  auto c = decode_checkpoint(std::string{reinterpret_cast<const char*>(bytes), sizeof bytes});
  if (!c)
    CHECK(is(c.error(), errc::corrupt_data));
  else
    CHECK(c->params.size() == c->end - c->begin);
}

TEST_CASE("the job store resumes only the same configuration, and keeps earlier runs' progress under this run's") {
  test::temp_dir dir;
  train_config cfg;
  cfg.checkpoint_dir = dir.path() + "/ckpt";
  {
    auto store = job_store::open(cfg);
    REQUIRE(store);
    REQUIRE(*store);
    wire::worker_stats w;
    w.worker_id = 1;
    w.steps = 10;
    w.samples = 640;
    w.batch = 64;
    w.position = wire::data_position{0, 100, 7, 2, 30};
    REQUIRE_FALSE((*store)->save(640, 3.5, {w}, "shl"));
  }
  // Without --resume, a directory holding a job is refused.
  auto taken = job_store::open(cfg);
  REQUIRE_FALSE(taken);
  CHECK(describe(taken.error()).find("--resume") != std::string::npos);
  cfg.resume = true;
  auto resumed = std::make_optional(job_store::open(cfg));
  auto& opened = *resumed;
  REQUIRE(opened);
  REQUIRE(*opened);
  auto& js = **opened;
  CHECK(js.samples_before() == 640);
  CHECK(js.record().resumes == 1);
  CHECK(js.record().stage == "shl");
  REQUIRE(js.record().workers.size() == 1);
  CHECK(js.record().workers[0].position.pos == 30);
  // This run's figures go on top of the earlier run's.
  wire::worker_stats w;
  w.worker_id = 1;
  w.steps = 5;
  w.samples = 320;
  w.batch = 64;
  w.position = wire::data_position{0, 100, 7, 2, 60};
  REQUIRE_FALSE(js.save(320, 1.0, {w}, ""));
  CHECK(js.record().samples == 960);
  CHECK(js.record().workers[0].samples == 960);
  CHECK(js.record().stage == "shl"); // "" keeps it
  resumed.reset(); // closes the store
  // Another configuration is refused, naming the setting and both values.
  cfg.batch_size = 32;
  auto changed = job_store::open(cfg);
  REQUIRE_FALSE(changed);
  INFO(describe(changed.error()));
  CHECK(describe(changed.error()).find("train.batch_size = 32 (checkpointed job: 64)") != std::string::npos);
  CHECK(settings_diff({"a=1", "b=2"}, {"a=1", "b=2"}).empty());
}

namespace {

// A store whose three synced writes are only in its write-ahead log: a child process
// writes them and ends without closing it (as a crash would). Returns the log's path.
std::string store_with_wal_only(const std::string& dir) {
  pid_t pid = ::fork();
  if (pid == 0) {
    auto s = open_rocksdb_store(dir, open_mode::create);
    for (int i = 0; i < 3 && s; ++i) {
      kv_batch b;
      b.puts.push_back({"k" + std::to_string(i), std::string(4000, static_cast<char>('a' + i))});
      if ((*s)->write(b))
        ::_exit(1);
    }
    ::_exit(s ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".log")
      return e.path().string();
  FAIL("no write-ahead log in " << dir);
  return {};
}

}  // namespace

TEST_CASE("a checkpoint store's log damaged in the middle fails to open, naming it, and a write torn at its end is dropped") {
  test::temp_dir dir;
  // Damage in the middle: refused, not reopened as an older store.
  const auto damaged = dir.path() + "/damaged";
  auto wal = store_with_wal_only(damaged);
  const auto size = std::filesystem::file_size(wal);
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.put(static_cast<char>(c ^ 0x5a));
  }
  auto bad = open_rocksdb_store(damaged, open_mode::existing);
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("cannot open the checkpoint store " + damaged) != std::string::npos);
  CHECK(describe(bad.error()).find("Corruption") != std::string::npos);
  // A torn last write (a crash in the middle of it, never acknowledged): the rest opens.
  const auto torn = dir.path() + "/torn";
  auto wal2 = store_with_wal_only(torn);
  std::filesystem::resize_file(wal2, std::filesystem::file_size(wal2) - 100);
  auto ok = open_rocksdb_store(torn, open_mode::existing);
  REQUIRE(ok);
  auto k1 = (*ok)->get("k1");
  REQUIRE(k1);
  CHECK(k1->has_value());
  auto k2 = (*ok)->get("k2");
  REQUIRE(k2);
  CHECK_FALSE(k2->has_value());
}
