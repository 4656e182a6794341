#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <thread>

#include "runtime/store/kv_store.hpp"
#include "runtime/store/store_lease.hpp"
#include "temp_dir.hpp"

using namespace ashlar;
using namespace std::chrono_literals;

namespace {

kv_batch put(std::string k, std::string v) {
  kv_batch b;
  b.puts.emplace_back(std::move(k), std::move(v));
  return b;
}

std::string lease_in(const std::string& dir) {
  auto l = read_lease(dir);
  REQUIRE(l);
  REQUIRE(l->has_value());
  return **l;
}

}  // namespace

TEST_CASE("a lease watch calls a lease stale only once it has seen it unchanged for the stale time, and a renewal "
          "starts the wait again") {
  lease_watch w;
  // Seen for the first time: a wait starts, however old the lease may be.
  auto v = w.observe("/ck/shard-1", "node a\nrenewal 7\n", 100.0, 6.0);
  CHECK_FALSE(v.stale);
  CHECK(v.unchanged_s == 0);
  v = w.observe("/ck/shard-1", "node a\nrenewal 7\n", 104.0, 6.0);
  CHECK_FALSE(v.stale);
  CHECK(v.unchanged_s == Approx(4.0));
  // Renewed meanwhile (a holder that was only slow): the wait starts again.
  v = w.observe("/ck/shard-1", "node a\nrenewal 8\n", 105.0, 6.0);
  CHECK_FALSE(v.stale);
  CHECK(w.observe("/ck/shard-1", "node a\nrenewal 8\n", 110.9, 6.0).stale == false);
  v = w.observe("/ck/shard-1", "node a\nrenewal 8\n", 111.0, 6.0);
  CHECK(v.stale);
  CHECK(v.unchanged_s == Approx(6.0));
  // Each store has its own wait; a forgotten one starts afresh.
  CHECK_FALSE(w.observe("/ck/shard-0", "node a\nrenewal 8\n", 111.0, 6.0).stale);
  w.forget("/ck/shard-1");
  CHECK_FALSE(w.observe("/ck/shard-1", "node a\nrenewal 8\n", 200.0, 6.0).stale);
  CHECK(lease_holder("node a, pid 7 on h\nrenewal 8\n") == "node a, pid 7 on h");
}

TEST_CASE("a store's lease is renewed while its holder holds it and stands still once the holder lets go") {
  test::temp_dir dir;
  CHECK_FALSE(read_lease(dir.path())->has_value()); // no lease yet
  {
    auto lease = store_lease::take(dir.path(), "node s1, pid 1 on h", 20);
    REQUIRE(lease);
    const auto first = lease_in(dir.path());
    CHECK(lease_holder(first) == "node s1, pid 1 on h");
    std::this_thread::sleep_for(200ms);
    CHECK(lease_in(dir.path()) != first);
    CHECK((*lease)->renewals() > 1);
  }
  const auto last = lease_in(dir.path());
  std::this_thread::sleep_for(100ms);
  CHECK(lease_in(dir.path()) == last);
  // A directory it cannot write into: an error naming the file.
  auto bad = store_lease::take(dir.file("missing/deeper"), "x");
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), errc::io_error));
  CHECK(describe(bad.error()).find("missing/deeper/ashlar-lease") != std::string::npos);
}

TEST_CASE("a shard store lives in generations behind a link, and a store of the layout before them is moved behind "
          "one when no process holds it") {
  test::temp_dir dir;
  // None yet: generation 1, the link made.
  auto g = store_generation_of(dir.file("shard-0"));
  REQUIRE(g);
  CHECK(g->generation == 1);
  CHECK(g->path == dir.file("shard-0.1"));
  CHECK(std::filesystem::read_symlink(dir.file("shard-0")) == "shard-0.1"); // relative: the directory can move
  {
    auto s = open_rocksdb_store(g->path, open_mode::create);
    REQUIRE(s);
    REQUIRE_FALSE((*s)->write(put("k", "v")));
  }
  auto again = store_generation_of(dir.file("shard-0"));
  REQUIRE(again);
  CHECK(again->path == g->path);
  // Readers open the link.
  auto r = open_rocksdb_store(dir.file("shard-0"), open_mode::read_only);
  REQUIRE(r);
  CHECK((*r)->get("k").value() == std::optional<std::string>{"v"});
  // The old layout: a store in a directory of the link's name.
  {
    auto s = open_rocksdb_store(dir.file("shard-1"), open_mode::create);
    REQUIRE(s);
    REQUIRE_FALSE((*s)->write(put("old", "1")));
    // Held: it stays where it is, and says why.
    auto held = store_generation_of(dir.file("shard-1"));
    REQUIRE_FALSE(held);
    CHECK(is(held.error(), errc::busy));
    CHECK(std::filesystem::is_directory(std::filesystem::symlink_status(dir.file("shard-1"))));
  }
  auto moved = store_generation_of(dir.file("shard-1"));
  REQUIRE(moved);
  CHECK(moved->path == dir.file("shard-1.1"));
  auto s = open_rocksdb_store(moved->path, open_mode::existing);
  REQUIRE(s);
  CHECK((*s)->get("old").value() == std::optional<std::string>{"1"});
  // A link that points elsewhere is refused, naming it.
  std::filesystem::create_directory_symlink("/tmp", dir.file("shard-2"));
  auto odd = store_generation_of(dir.file("shard-2"));
  REQUIRE_FALSE(odd);
  CHECK(describe(odd.error()).find("shard-2") != std::string::npos);
  // A generation that is itself a link (planted inside the checkpoint directory) is not
  // used, whether the store's link names it or none does yet.
  std::filesystem::create_directories(dir.file("elsewhere"));
  std::filesystem::create_directory_symlink(dir.file("elsewhere"), dir.file("shard-3.1"));
  std::filesystem::create_directory_symlink("shard-3.1", dir.file("shard-3"));
  auto linked = store_generation_of(dir.file("shard-3"));
  REQUIRE_FALSE(linked);
  CHECK(describe(linked.error()).find("is a symbolic link, not a directory") != std::string::npos);
  std::filesystem::create_directory_symlink(dir.file("elsewhere"), dir.file("shard-4.1"));
  auto fresh = store_generation_of(dir.file("shard-4"));
  REQUIRE_FALSE(fresh);
  CHECK(std::filesystem::is_empty(dir.file("elsewhere")));
}

TEST_CASE("a copy of a checkpoint directory opens its newest generation whether the copy kept the links, followed "
          "them or dropped them") {
  test::temp_dir dir;
  const auto src = dir.file("ck");
  std::filesystem::create_directory(src);
  // Generation 2 is the newest (a takeover made it): "gen" in it, "old" in generation 1.
  for (uint32_t g : {1u, 2u}) {
    auto s = open_rocksdb_store(src + "/shard-0." + std::to_string(g), open_mode::create);
    REQUIRE(s);
    REQUIRE_FALSE((*s)->write(put("gen", g == 2 ? "new" : "old")));
  }
  std::filesystem::create_directory_symlink("shard-0.2", src + "/shard-0");
  auto newest = [](const std::string& link) {
    auto g = store_generation_of(link);
    REQUIRE(g);
    auto s = open_rocksdb_store(g->path, open_mode::existing);
    REQUIRE(s);
    return std::make_pair(g->generation, (*s)->get("gen").value().value_or("none"));
  };
  // Kept (cp -a): as it was.
  std::filesystem::copy(src, dir.file("kept"), std::filesystem::copy_options::recursive
                                                 | std::filesystem::copy_options::copy_symlinks);
  CHECK(newest(dir.file("kept/shard-0")) == std::make_pair(2u, std::string{"new"}));
  // Followed (cp -rL): shard-0 is a directory of the newest records, and becomes generation 3.
  std::filesystem::copy(src, dir.file("followed"), std::filesystem::copy_options::recursive);
  REQUIRE(std::filesystem::is_directory(std::filesystem::symlink_status(dir.file("followed/shard-0"))));
  CHECK(newest(dir.file("followed/shard-0")) == std::make_pair(3u, std::string{"new"}));
  CHECK(std::filesystem::read_symlink(dir.file("followed/shard-0")) == "shard-0.3");
  // Dropped (rsync -r): the link is made again, to the newest generation.
  std::filesystem::create_directory(dir.file("dropped"));
  for (const char* g : {"shard-0.1", "shard-0.2"})
    std::filesystem::copy(src + "/" + g, dir.file("dropped/") + g, std::filesystem::copy_options::recursive);
  CHECK(newest(dir.file("dropped/shard-0")) == std::make_pair(2u, std::string{"new"}));
}

TEST_CASE("a store whose holder no longer runs is taken over: its records go into the next generation, the link "
          "moves to it, and the holder's later writes and renewals stay in its own generation") {
  test::temp_dir dir;
  const auto link = dir.file("shard-1");
  auto gen = store_generation_of(link);
  REQUIRE(gen);
  auto held = open_rocksdb_store(gen->path, open_mode::create);
  REQUIRE(held);
  REQUIRE_FALSE((*held)->write(put("cut/1", "one")));
  REQUIRE_FALSE((*held)->write(put("cut/2", "two")));
  auto lease = store_lease::take(gen->path, "node s1", 20);
  REQUIRE(lease);
  // The lock is held: opening it fails with busy. (Across processes the lock is the
  // file's; inside one, RocksDB tells by the path, so this opens the generation's own.)
  auto again = open_rocksdb_store(gen->path, open_mode::create);
  REQUIRE_FALSE(again);
  CHECK(is(again.error(), errc::busy));

  auto taken = take_over_store(link);
  INFO((taken ? std::string{} : describe(taken.error())));
  REQUIRE(taken);
  CHECK(taken->abandoned == gen->path);
  CHECK(taken->now.generation == 2);
  CHECK(taken->now.path == dir.file("shard-1.2"));
  CHECK(std::filesystem::read_symlink(link) == "shard-1.2");
  auto& store = *taken->store;
  CHECK(store.get("cut/1").value() == std::optional<std::string>{"one"});
  CHECK(store.get("cut/2").value() == std::optional<std::string>{"two"});
  // The holder's writes land in its own generation, never in the new one.
  REQUIRE_FALSE((*held)->write(put("cut/3", "three")));
  CHECK_FALSE(store.get("cut/3").value().has_value());
  REQUIRE_FALSE(store.write(put("cut/3", "mine")));
  auto old = open_rocksdb_store(gen->path, open_mode::read_only);
  REQUIRE(old);
  CHECK((*old)->get("cut/3").value() == std::optional<std::string>{"three"});
  // Its renewals too: the new generation has no lease until its new holder takes one.
  CHECK_FALSE(read_lease(link)->has_value());
  const auto before = lease_in(gen->path);
  std::this_thread::sleep_for(100ms);
  CHECK(lease_in(gen->path) != before);
  // Nothing half-made is left beside them: the link and two generations.
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 3);
  // Readers of the link see the new generation.
  taken->store.reset();
  auto reader = open_rocksdb_store(link, open_mode::read_only);
  REQUIRE(reader);
  CHECK((*reader)->get("cut/3").value() == std::optional<std::string>{"mine"});
  // A store of the layout before generations is not taken over while held.
  auto plain = open_rocksdb_store(dir.file("shard-7"), open_mode::create);
  REQUIRE(plain);
  auto refused = take_over_store(dir.file("shard-7"));
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), errc::busy));
  CHECK(describe(refused.error()).find("layout before generations") != std::string::npos);
}
