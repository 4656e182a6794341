// Checkpoint records and the stores they live in: memory, and RocksDB on disk for real.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <fstream>
#include <filesystem>
#include <unistd.h>
#include <sys/wait.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "runtime/config/train_config.hpp"
#include "runtime/store/checkpoint.hpp"
#include "runtime/store/job_store.hpp"
#include "runtime/store/kv_store.hpp"
#include "schema/ashlar.capnp.h"
#include "temp_dir.hpp"

using namespace ashlar;

namespace {

std::vector<float> ramp(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Saves cuts 1..n of shard 2 (range [100, 110)) at versions 10, 20, ..., params = ramp(cut).
void save_cuts(checkpoint_log& log, uint64_t n) {
  for (uint64_t c = 1; c <= n; ++c) {
    auto p = ramp(10, static_cast<float>(c));
    auto m = ramp(10, -static_cast<float>(c));
    REQUIRE(log.save(10 * c, c, 100, 110, p.data(), m.data()));
  }
}

// CRC-32 (IEEE, as zlib's crc32), bit by bit.
uint64_t crc32_of(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k)
      crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}

std::string cut_key(uint64_t cut) {
  auto n = std::to_string(cut);
  return "shard/2/c/" + std::string(20 - n.size(), '0') + n;
}

// A job store under cfg.checkpoint_dir that committed cuts 1..n (320 samples and 1.5 s each).
void commit_cuts(const train_config& cfg, uint64_t n) {
  auto store = job_store::open(cfg);
  REQUIRE(store);
  REQUIRE(*store);
  REQUIRE_FALSE((*store)->adopt(0));
  for (uint64_t c = 1; c <= n; ++c)
    REQUIRE_FALSE((*store)->commit(c, 320 * c, 1.5 * static_cast<double>(c), {}, ""));
}

// The record `bytes` of schema S stamped with record format `format` (as a later build
// would write it), everything else as it was.
template <class S>
std::string restamped(const std::string& bytes, uint32_t format) {
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  capnp::FlatArrayMessageReader reader{words};
  capnp::MallocMessageBuilder mb;
  mb.setRoot(reader.getRoot<S>());
  mb.getRoot<S>().setFormat(format);
  auto out = capnp::messageToFlatArray(mb);
  return std::string(reinterpret_cast<const char*>(out.asBytes().begin()), out.asBytes().size());
}

}  // namespace

TEST_CASE("a checkpoint round-trips through its record, and a flipped byte or a truncated record is refused") {
  auto p = ramp(10, 1.5f);
  auto m = ramp(10, -3.0f);
  auto bytes = encode_checkpoint(4, 77, 9, 20, 30, 123, p.data(), m.data());
  auto c = decode_checkpoint(bytes);
  REQUIRE(c);
  CHECK(c->shard_id == 4);
  CHECK(c->version == 77);
  CHECK(c->cut == 9);
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

TEST_CASE("a checkpoint's running average round-trips with the samples it had seen, under the checksum, and a "
          "record without one decodes with none") {
  auto p = ramp(10, 1.5f);
  auto m = ramp(10, -3.0f);
  auto a = ramp(10, 7.25f);
  auto bytes = encode_checkpoint(4, 77, 9, 20, 30, 123, p.data(), m.data(), a.data(), 4321);
  auto c = decode_checkpoint(bytes);
  REQUIRE(c);
  CHECK(c->params == p);
  CHECK(c->velocity == m);
  CHECK(c->average == a);
  CHECK(c->average_samples == 4321);
  // The average is under the checksum: a bit flipped in it is caught. (The average is the
  // last tensor written; find its first float in the bytes.)
  const float first = a.front();
  const auto at = bytes.rfind(std::string(reinterpret_cast<const char*>(&first), 4));
  REQUIRE(at != std::string::npos);
  auto flipped = bytes;
  flipped[at + 1] ^= 0x01;
  auto bad = decode_checkpoint(flipped);
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("checksum mismatch") != std::string::npos);
  // Without an average (a shard that keeps none): none.
  auto plain = decode_checkpoint(encode_checkpoint(4, 77, 9, 20, 30, 123, p.data(), m.data()));
  REQUIRE(plain);
  CHECK(plain->average.empty());
  CHECK(plain->average_samples == 0);
  // A record as written before averages were stored, its checksum computed here by the
  // format's own rule (CRC-32 over shard id, version, begin, end, cut, parameters,
  // velocity), decodes.
  {
    capnp::MallocMessageBuilder mb;
    auto r = mb.initRoot<schema::CheckpointRecord>();
    r.setShardId(4);
    r.setVersion(77);
    r.setCut(9);
    r.setBegin(20);
    r.setEnd(30);
    r.setUnixNs(123);
    std::memcpy(r.initParams(40).begin(), p.data(), 40);
    std::memcpy(r.initVelocity(40).begin(), m.data(), 40);
    std::string summed(36, '\0');
    const uint32_t id = 4;
    const uint64_t ident[4] = {77, 20, 30, 9}; // version, begin, end, cut
    std::memcpy(&summed[0], &id, 4);
    std::memcpy(&summed[4], ident, 32);
    summed.append(reinterpret_cast<const char*>(p.data()), 40);
    summed.append(reinterpret_cast<const char*>(m.data()), 40);
    r.setChecksum(crc32_of(summed));
    auto words = capnp::messageToFlatArray(mb);
    auto old = decode_checkpoint(std::string(reinterpret_cast<const char*>(words.asBytes().begin()),
                                             words.asBytes().size()));
    REQUIRE(old);
    CHECK(old->params == p);
    CHECK(old->velocity == m);
    CHECK(old->average.empty());
  }
  // Saved through a log and loaded back.
  auto store = make_memory_store();
  checkpoint_log log{*store, 2, 3};
  REQUIRE(log.save(10, 1, 100, 110, p.data(), nullptr, a.data(), 99));
  auto loaded = log.load(1);
  REQUIRE(loaded);
  CHECK(loaded->average == a);
  CHECK(loaded->average_samples == 99);
  CHECK(loaded->velocity.empty());
}

TEST_CASE("a checkpoint log keeps the newest N cuts, loads each by its cut, and a stop record newer than them") {
  auto store = make_memory_store();
  checkpoint_log log{*store, 2, 3};
  auto none = log.load_latest();
  REQUIRE(none);
  CHECK_FALSE(none->has_value());
  save_cuts(log, 5);
  auto list = log.list();
  REQUIRE(list);
  REQUIRE(list->size() == 3);
  CHECK((*list)[0].cut == 3);
  CHECK((*list)[0].version == 30);
  CHECK((*list)[2].cut == 5);
  for (const auto& i : *list)
    CHECK(i.intact);
  auto cuts = log.intact_cuts();
  REQUIRE(cuts);
  CHECK(*cuts == std::vector<uint64_t>{3, 4, 5});
  auto four = log.load(4);
  REQUIRE(four);
  CHECK(four->version == 40);
  CHECK(four->params == ramp(10, 4.0f));
  CHECK_FALSE(log.load(1)); // pruned
  auto c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->cut == 5);
  CHECK((*c)->velocity == ramp(10, -5.0f));
  // The node stopped the shard at version 57: its stop record is the newest state, and
  // no cut is pruned for it.
  auto p = ramp(10, 57.0f);
  REQUIRE(log.save(57, 0, 100, 110, p.data(), nullptr));
  c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->version == 57);
  CHECK((*c)->cut == 0);
  CHECK(log.intact_cuts()->size() == 3);
  // A resume from cut 4 drops what came after it: cut 5 and the stop record.
  REQUIRE_FALSE(log.discard_after(4));
  CHECK(*log.intact_cuts() == std::vector<uint64_t>{3, 4});
  c = log.load_latest();
  REQUIRE(c->has_value());
  CHECK((*c)->cut == 4);
  auto shards = stored_shards(*store);
  REQUIRE(shards);
  CHECK(*shards == std::vector<uint32_t>{2});
}

TEST_CASE("a checkpoint log keeps the job's last committed cut beside the newest N, however many cuts after it are written") {
  auto store = make_memory_store();
  checkpoint_log log{*store, 0, 3};
  auto p = ramp(10, 1.0f);
  // Cut 2 committed; cuts 3 to 7 written and abandoned one after another (a node lost
  // again and again while each was in flight).
  for (uint64_t cut = 1; cut <= 7; ++cut)
    REQUIRE(log.save(cut * 10, cut, 0, 10, p.data(), nullptr, nullptr, 0, cut > 2 ? 2 : 0));
  CHECK(*log.intact_cuts() == std::vector<uint64_t>{2, 5, 6, 7});
  auto two = log.load(2);
  REQUIRE(two);
  CHECK(two->version == 20);
  // Cut 6 committed at last: cut 2 goes with the next write, as any cut beyond the newest 3.
  REQUIRE(log.save(80, 8, 0, 10, p.data(), nullptr, nullptr, 0, 6));
  CHECK(*log.intact_cuts() == std::vector<uint64_t>{6, 7, 8});
}

TEST_CASE("a corrupt or truncated cut is not intact, and the newest intact one is loaded instead") {
  auto store = make_memory_store();
  checkpoint_log log{*store, 2, 3};
  save_cuts(log, 4);
  // Corrupt cut 4 in place (as a bad disk would), then truncate cut 3 too.
  auto v4 = store->get(cut_key(4));
  REQUIRE(v4);
  REQUIRE(v4->has_value());
  auto bad = **v4;
  bad[bad.size() - 20] ^= 0x01; // in the tensors
  REQUIRE_FALSE(store->write({{{cut_key(4), bad}}, {}}));
  auto c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->cut == 3);
  auto v3 = store->get(cut_key(3));
  REQUIRE_FALSE(store->write({{{cut_key(3), (**v3).substr(0, 40)}}, {}}));
  c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->cut == 2);
  CHECK(*log.intact_cuts() == std::vector<uint64_t>{2});
  auto list = log.list();
  REQUIRE(list);
  REQUIRE(list->size() == 3);
  CHECK((*list)[0].intact);
  CHECK_FALSE((*list)[1].intact);
  CHECK_FALSE((*list)[2].intact);
  INFO((*list)[2].problem);
  CHECK((*list)[2].problem.find("checksum") != std::string::npos);
  CHECK_FALSE(log.load(4));
  // Another cut's record under a cut's key (a mixed-up store) is not that cut.
  REQUIRE_FALSE(store->write({{{cut_key(4), **store->get(cut_key(2))}}, {}}));
  CHECK(*log.intact_cuts() == std::vector<uint64_t>{2});
}

TEST_CASE("a shard's checkpoint in a newer record format fails its loads naming it, is neither passed over nor deleted, and format 0 reads as 1") {
  ashlar::test::temp_dir dir;
  auto opened = open_rocksdb_store(dir.file("store"), open_mode::create);
  REQUIRE(opened);
  auto& store = **opened;
  checkpoint_log log{store, 2, 3};
  save_cuts(log, 3);
  auto v3 = store.get(cut_key(3));
  REQUIRE(v3);
  REQUIRE(v3->has_value());
  const auto written = **v3;
  // What this build writes reads back, and so does a record stamped 0 (before formats).
  REQUIRE(decode_checkpoint(written));
  REQUIRE(decode_checkpoint(restamped<schema::CheckpointRecord>(written, 0)));
  const auto newer = restamped<schema::CheckpointRecord>(written, checkpoint_format + 1);
  auto d = decode_checkpoint(newer);
  REQUIRE_FALSE(d);
  CHECK(is(d.error(), errc::unsupported_format));
  const auto told = describe(d.error());
  INFO(told);
  CHECK(told.find("shard 2's checkpoint record of version 30, cut 3 is in record format "
                  + std::to_string(checkpoint_format + 1))
        != std::string::npos);
  CHECK(told.find("reads formats up to " + std::to_string(checkpoint_format)) != std::string::npos);

  REQUIRE_FALSE(store.write({{{cut_key(3), newer}}, {}}));
  // A resume asks for the intact cuts and a shard served again for its latest: both fail,
  // naming the store and the key, instead of falling back to cut 2.
  auto cuts = log.intact_cuts();
  REQUIRE_FALSE(cuts);
  CHECK(is(cuts.error(), errc::unsupported_format));
  CHECK(describe(cuts.error()).find(store.where() + ", " + cut_key(3)) != std::string::npos);
  auto latest = log.load_latest();
  REQUIRE_FALSE(latest);
  CHECK(is(latest.error(), errc::unsupported_format));
  CHECK(log.load(2)); // the older cuts are still readable one by one
  auto listed = log.list();
  REQUIRE(listed);
  REQUIRE(listed->size() == 3);
  CHECK_FALSE((*listed)[2].intact);
  CHECK((*listed)[2].newer_format);
  CHECK((*listed)[1].intact);
  CHECK_FALSE((*listed)[1].newer_format);
  // Saving another cut keeps the newest 3 as ever; the record itself is untouched.
  auto kept = store.get(cut_key(3));
  REQUIRE(kept);
  REQUIRE(kept->has_value());
  CHECK(**kept == newer);
}

TEST_CASE("a job record in a newer record format fails the job store's open naming it, and stays on disk") {
  test::temp_dir dir;
  train_config cfg;
  cfg.checkpoint_dir = dir.path() + "/ckpt";
  commit_cuts(cfg, 2);
  const std::string key = "cut/00000000000000000002";
  std::string newer;
  {
    auto raw = open_rocksdb_store(cfg.checkpoint_dir + "/job", open_mode::existing);
    REQUIRE(raw);
    auto v = (*raw)->get(key);
    REQUIRE(v);
    REQUIRE(v->has_value());
    newer = restamped<schema::JobRecord>(**v, job_record_format + 1);
    REQUIRE_FALSE((*raw)->write({{{key, newer}}, {}}));
    auto cuts = load_job_cuts(**raw);
    REQUIRE_FALSE(cuts);
    CHECK(is(cuts.error(), errc::unsupported_format));
    INFO(describe(cuts.error()));
    CHECK(describe(cuts.error()).find(key) != std::string::npos);
    CHECK(describe(cuts.error()).find("the job's record of cut 2 is in record format "
                                      + std::to_string(job_record_format + 1))
          != std::string::npos);
  }
  cfg.resume = true;
  auto opened = job_store::open(cfg);
  REQUIRE_FALSE(opened); // not a resume from cut 1 that would then discard cut 2
  CHECK(is(opened.error(), errc::unsupported_format));
  auto raw = open_rocksdb_store(cfg.checkpoint_dir + "/job", open_mode::existing);
  REQUIRE(raw);
  auto v = (*raw)->get(key);
  REQUIRE(v);
  REQUIRE(v->has_value());
  CHECK(**v == newer);
}

TEST_CASE("RocksDB keeps checkpoints and the job record (members' shares and data positions) on disk across a reopen, and a second opener is refused naming the directory") {
  ashlar::test::temp_dir dir;
  const auto path = dir.file("store");
  {
    auto store = open_rocksdb_store(path, open_mode::create);
    REQUIRE(store);
    checkpoint_log log{**store, 2, 2};
    save_cuts(log, 3);
    job_record r;
    r.cut = 3;
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
    CHECK(describe(again.error()).find("the store is open elsewhere") != std::string::npos);
    CHECK(is(again.error(), errc::busy));
  }
  auto store = open_rocksdb_store(path, open_mode::existing);
  REQUIRE(store);
  checkpoint_log log{**store, 2, 2};
  auto c = log.load_latest();
  REQUIRE(c);
  REQUIRE(c->has_value());
  CHECK((*c)->cut == 3);
  CHECK((*c)->params == ramp(10, 3.0f));
  auto list = log.list();
  REQUIRE(list);
  CHECK(list->size() == 2);
  auto job = load_job_record(**store);
  REQUIRE(job);
  REQUIRE(job->has_value());
  CHECK((*job)->cut == 3);
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

TEST_CASE("the job store resumes only the same configuration, from the cut it adopts, and keeps earlier runs' progress under this run's") {
  test::temp_dir dir;
  train_config cfg;
  cfg.checkpoint_dir = dir.path() + "/ckpt";
  {
    auto store = job_store::open(cfg);
    REQUIRE(store);
    REQUIRE(*store);
    REQUIRE_FALSE((*store)->adopt(0));
    wire::worker_stats w;
    w.worker_id = 1;
    w.steps = 10;
    w.samples = 640;
    w.batch = 64;
    w.position = wire::data_position{0, 100, 7, 2, 30};
    REQUIRE_FALSE((*store)->commit(1, 320, 1.5, {w}, "ahl"));
    REQUIRE_FALSE((*store)->commit(2, 640, 3.5, {w}, "shl"));
  }
  // Without --resume, a directory holding a job is refused.
  auto taken = job_store::open(cfg);
  REQUIRE_FALSE(taken);
  CHECK(describe(taken.error()).find("--resume") != std::string::npos);
  cfg.resume = true;
  {
    auto opened = job_store::open(cfg);
    REQUIRE(opened);
    REQUIRE(*opened);
    auto& js = **opened;
    CHECK(js.committed_cuts() == std::vector<uint64_t>{2, 1, 0}); // 0: the job's start record
    // The shards lacked cut 2: the job takes cut 1 up, and cut 2's record goes.
    REQUIRE_FALSE(js.adopt(1));
    CHECK(js.samples_before() == 320);
    CHECK(js.record().stage == "ahl");
    CHECK(js.cut() == 1);
  }
  auto resumed = std::make_optional(job_store::open(cfg));
  auto& opened = *resumed;
  REQUIRE(opened);
  REQUIRE(*opened);
  auto& js = **opened;
  CHECK(js.committed_cuts() == std::vector<uint64_t>{1, 0});
  REQUIRE_FALSE(js.adopt(1));
  CHECK(js.samples_before() == 320);
  CHECK(js.record().resumes == 1);
  REQUIRE(js.record().workers.size() == 1);
  CHECK(js.record().workers[0].position.pos == 30);
  CHECK(js.adopt(7)); // not a committed cut
  // This run's figures go on top of the earlier run's.
  wire::worker_stats w;
  w.worker_id = 1;
  w.steps = 5;
  w.samples = 320;
  w.batch = 64;
  w.position = wire::data_position{0, 100, 7, 2, 60};
  REQUIRE_FALSE(js.commit(2, 320, 1.0, {w}, ""));
  CHECK(js.record().samples == 640);
  CHECK(js.record().workers[0].samples == 960);
  CHECK(js.record().stage == "ahl"); // "" keeps it
  CHECK(js.record().cut == 2);
  resumed.reset(); // closes the store
  // Another configuration is refused, naming the setting and both values.
  cfg.batch_size = 32;
  auto changed = job_store::open(cfg);
  REQUIRE_FALSE(changed);
  INFO(describe(changed.error()));
  CHECK(describe(changed.error()).find("train.batch_size = 32 (checkpointed job: 64)") != std::string::npos);
  CHECK(settings_diff({"a=1", "b=2"}, {"a=1", "b=2"}).empty());
  // The running average is what is evaluated, not what is trained: a resume may turn it
  // on, off or change it (a job checkpointed before adsp's and ashl's rule resumes).
  cfg.batch_size = 64;
  cfg.average_epochs = 0.0625;
  auto averaged = job_store::open(cfg);
  INFO((averaged ? std::string{} : describe(averaged.error())));
  CHECK(averaged);
}

TEST_CASE("a job stopped before its first commit is still known by its start record and resumes from the beginning") {
  test::temp_dir dir;
  train_config cfg;
  cfg.checkpoint_dir = dir.path() + "/ckpt";
  {
    auto store = job_store::open(cfg);
    REQUIRE(store);
    REQUIRE(*store);
    REQUIRE_FALSE((*store)->adopt(0)); // a new job: its start record goes in
  }
  // Without --resume the directory is this job's ...
  auto taken = job_store::open(cfg);
  REQUIRE_FALSE(taken);
  CHECK(describe(taken.error()).find("0 samples trained") != std::string::npos);
  // ... and a resume finds the start record (cut 0) with the same settings.
  cfg.resume = true;
  auto resumed = job_store::open(cfg);
  REQUIRE(resumed);
  REQUIRE(*resumed);
  CHECK((*resumed)->committed_cuts() == std::vector<uint64_t>{0});
  auto choice = choose_cut((*resumed)->committed_cuts(), {{0, {1}}, {1, {1}}}, cfg.checkpoint_dir);
  REQUIRE(choice);
  CHECK(choice->cut == 0);
  CHECK((*resumed)->samples_before() == 0);
}

TEST_CASE("a job whose committed records are damaged does not fall back to its start record") {
  test::temp_dir dir;
  train_config cfg;
  cfg.checkpoint_dir = dir.path() + "/ckpt";
  commit_cuts(cfg, 1);
  {
    // Cut 1's record is damaged on disk: only the start record still loads.
    auto raw = open_rocksdb_store(cfg.checkpoint_dir + "/job", open_mode::existing);
    REQUIRE(raw);
    kv_batch b;
    b.puts.emplace_back("cut/00000000000000000001", "not a record");
    REQUIRE_FALSE((*raw)->write(b));
  }
  cfg.resume = true;
  auto opened = job_store::open(cfg);
  REQUIRE(opened);
  REQUIRE(*opened);
  // Not {0}: starting over would drop the shards' intact cut 1; a resume is refused instead.
  CHECK((*opened)->committed_cuts().empty());
  CHECK_FALSE(choose_cut((*opened)->committed_cuts(), {{0, {1}}}, cfg.checkpoint_dir));
}

TEST_CASE("a resume takes the newest cut the job record names and every shard holds intact, or refuses naming the shard and what it lacks") {
  const std::string dir = "/data/ck";
  // Every shard holds the job's newest cut.
  auto all = choose_cut({7, 8, 9}, {{0, {7, 8, 9}}, {1, {8, 9}}}, dir);
  REQUIRE(all);
  CHECK(all->cut == 9);
  CHECK(all->passed_over.empty());
  // Shard 1's cut 9 is damaged: both shards go back to cut 8, saying why.
  auto back = choose_cut({7, 8, 9}, {{0, {7, 8, 9}}, {1, {7, 8}}}, dir);
  REQUIRE(back);
  CHECK(back->cut == 8);
  CHECK(back->passed_over == "cut 9: shard 1 lacks it intact (holds cuts 7, 8)");
  // A cut a shard wrote but the job never committed is not taken.
  auto uncommitted = choose_cut({8}, {{0, {8, 9}}, {1, {8, 9}}}, dir);
  REQUIRE(uncommitted);
  CHECK(uncommitted->cut == 8);
  // No cut on every shard (shard 1's directory was lost): refused, one line.
  auto none = choose_cut({8, 9}, {{0, {8, 9}}, {1, {}}}, dir);
  REQUIRE_FALSE(none);
  CHECK(is(none.error(), errc::corrupt_data));
  INFO(describe(none.error()));
  CHECK(describe(none.error()).find("cannot resume from /data/ck: no checkpoint cut is intact on every shard: shard 1 lacks cuts 9, 8 of the job record's 9, 8 (it holds intact cuts none)") != std::string::npos);
  // Each shard lacks another cut: the one holding fewer is named.
  auto split = choose_cut({8, 9}, {{0, {8}}, {1, {9}}, {2, {}}}, dir);
  REQUIRE_FALSE(split);
  CHECK(describe(split.error()).find("shard 2 lacks cuts 9, 8") != std::string::npos);
  CHECK(describe(none.error()).find('\n') == std::string::npos);
  // No job record but a shard holds cuts: starting over would mix two jobs.
  auto orphan = choose_cut({}, {{0, {}}, {1, {4, 5}}}, dir);
  REQUIRE_FALSE(orphan);
  CHECK(describe(orphan.error()).find("shard 1 holds checkpoint cuts (4, 5) that no job record names") != std::string::npos);
  // Only the job's start record: a run stopped before its first commit starts over (its
  // shards' uncommitted cuts are dropped) ...
  auto started = choose_cut({0}, {{0, {1}}, {1, {1, 2}}}, dir);
  REQUIRE(started);
  CHECK(started->cut == 0);
  // ... but once a cut was committed, the start record is no way back to the beginning.
  auto lost = choose_cut({2, 1, 0}, {{0, {1, 2}}, {1, {}}}, dir);
  REQUIRE_FALSE(lost);
  CHECK(describe(lost.error()).find("shard 1 lacks cuts 2, 1 of the job record's 2, 1 (it holds intact cuts none)")
        != std::string::npos);
  // Nothing anywhere: a new job.
  auto fresh = choose_cut({}, {{0, {}}, {1, {}}}, dir);
  REQUIRE(fresh);
  CHECK(fresh->cut == 0);
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

namespace {
// A store in memory whose disk can fill: while `full`, writes fail as RocksDB's do.
class full_disk_store : public ashlar::kv_store {
public:
  bool full = false;
  caf::error write(const ashlar::kv_batch& b) override {
    if (full)
      return ashlar::make_error(ashlar::errc::io_error, "IO error: No space left on device");
    return mem_->write(b);
  }
  ashlar::expected<std::optional<std::string>> get(const std::string& k) const override { return mem_->get(k); }
  ashlar::expected<std::vector<std::string>> keys(const std::string& p) const override { return mem_->keys(p); }
  std::string where() const override { return "memory"; }

private:
  std::unique_ptr<ashlar::kv_store> mem_ = ashlar::make_memory_store();
};
}  // namespace

TEST_CASE("a checkpoint writer reports a write that failed on a full disk until the next cut is asked for, then "
          "writes it once the disk has room") {
  full_disk_store store;
  ashlar::async_checkpointer w{store, 0, 3};
  ashlar::wire::shared_tensor params{1.0f, 1.0f, 1.0f, 1.0f};
  store.full = true;
  w.submit(5, 1, 0, 4, params, {});
  w.flush();
  CHECK(w.stats().error.find("No space left") != std::string::npos);
  CHECK(w.stats().newest_cut == 0);
  CHECK(w.stats().failures == 1);
  w.new_cut(); // cut 2 is asked for: cut 1's failure says nothing of it
  CHECK(w.stats().error.empty());
  store.full = false;
  w.submit(7, 2, 0, 4, params, {});
  w.flush();
  CHECK(w.stats().error.empty());
  CHECK(w.stats().newest_cut == 2);
}

TEST_CASE("a submitted job's record is opened beneath the work directory through no link: one planted for its "
          "directory is refused and nothing is written where it leads") {
  test::temp_dir dir;
  std::filesystem::create_directories(dir.file("work/ck"));
  std::filesystem::create_directories(dir.file("outside"));
  std::filesystem::create_directory_symlink(dir.file("outside"), dir.file("work/ck/job"));
  train_config cfg;
  cfg.confine_root = dir.file("work");
  cfg.checkpoint_dir = std::filesystem::canonical(dir.file("work")).string() + "/ck";
  auto planted = job_store::open(cfg);
  REQUIRE_FALSE(planted);
  CHECK(describe(planted.error()).find("run.checkpoint_dir") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir.file("outside")));
  // Without the link, the record is made in the work directory and names itself by it.
  std::filesystem::remove(dir.file("work/ck/job"));
  auto made = job_store::open(cfg);
  REQUIRE(made);
  REQUIRE(*made);
  CHECK(std::filesystem::is_directory(dir.file("work/ck/job")));
  CHECK(std::filesystem::is_empty(dir.file("outside")));
}
