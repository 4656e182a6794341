#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "runtime/store/store_clean.hpp"
#include "runtime/store/store_lease.hpp"
#include "temp_dir.hpp"

using namespace ashlar;

namespace {

bool named(const std::vector<clean_item>& items, const std::string& name) {
  return std::any_of(items.begin(), items.end(), [&](const clean_item& i) { return i.name == name; });
}

std::string why(const std::vector<clean_item>& items, const std::string& name) {
  for (const auto& i : items)
    if (i.name == name)
      return i.why;
  return {};
}

}  // namespace

TEST_CASE("a clean removes a shard's generations older than its link's and unclaimed takeover copies, and keeps "
          "newer ones and everything of a shard without a usable link") {
  const std::vector<checkpoint_dir_entry> entries{
    {"job", false, ""},
    {"notes.txt", false, ""},
    {"shard-0", true, "shard-0.3"},
    {"shard-0.1", false, ""},
    {"shard-0.2", false, ""},
    {"shard-0.3", false, ""},
    {"shard-0.4", false, ""},
    {"shard-0.taking-over-5-6", false, ""},
    {"shard-0.link-3", true, "shard-0.3"},
    {"shard-1", true, "shard-1.1"},
    {"shard-1.1", false, ""},
    {"shard-2.1", false, ""}, // a copy that dropped its links
    {"shard-2.2", false, ""},
    {"shard-3", true, "shard-3.2"}, // points to a generation that is not there
    {"shard-3.1", false, ""},
    {"shard-4", true, "../elsewhere"},
    {"shard-4.1", false, ""},
    {"shard-2.taking-over-7-8", false, ""},
    {"shard-5", false, ""}, // a directory: a copy that followed the links
    {"shard-5.1", false, ""},
    {"shard-5.taking-over-1-2", false, ""},
  };
  const auto plan = plan_clean(entries);
  CHECK(plan.remove.size() == 3);
  CHECK(named(plan.remove, "shard-0.1"));
  CHECK(named(plan.remove, "shard-0.2"));
  CHECK(why(plan.remove, "shard-0.1") == "generation 1 of shard-0, which points to generation 3 since a takeover");
  CHECK(named(plan.remove, "shard-0.taking-over-5-6"));
  CHECK(why(plan.keep, "shard-0.4").find("newer than generation 3") != std::string::npos);
  CHECK(named(plan.keep, "shard-2.1"));
  CHECK(named(plan.keep, "shard-2.2"));
  CHECK(why(plan.keep, "shard-3.1").find("not a generation here") != std::string::npos);
  CHECK(named(plan.keep, "shard-4.1"));
  // Without a usable link, not even a takeover's copy goes.
  CHECK(named(plan.keep, "shard-2.taking-over-7-8"));
  CHECK(why(plan.keep, "shard-5.1").find("shard-5 is a directory") == 0);
  CHECK(named(plan.keep, "shard-5.taking-over-1-2"));
  // Neither the linked generation, the job's store, a link being made nor a stranger's file.
  for (const auto* name : {"shard-0.3", "shard-1.1", "job", "notes.txt", "shard-0.link-3", "shard-0", "shard-1"}) {
    INFO(name);
    CHECK_FALSE(named(plan.remove, name));
    CHECK_FALSE(named(plan.keep, name));
  }
}

TEST_CASE("a store's lock holder is the process that holds the lock on its LOCK file, and none where it is free or "
          "absent") {
  ashlar::test::temp_dir dir;
  auto none = store_lock_holder(dir.path());
  REQUIRE(none);
  CHECK_FALSE(none->has_value()); // no LOCK file
  const auto lock_path = dir.file("LOCK");
  std::ofstream{lock_path} << "";
  auto free = store_lock_holder(dir.path());
  REQUIRE(free);
  CHECK_FALSE(free->has_value());
  // Another process locks it as RocksDB does (fcntl, a write lock on the whole file).
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int fd = ::open(lock_path.c_str(), O_RDWR);
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    const char ok = fd >= 0 && ::fcntl(fd, F_SETLK, &l) == 0 ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  char ok = 0;
  REQUIRE(::read(ready[0], &ok, 1) == 1);
  ::close(ready[0]);
  ::close(ready[1]);
  CHECK(ok == 'y');
  auto held = store_lock_holder(dir.path());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  REQUIRE(held);
  REQUIRE(held->has_value());
  CHECK(**held == child);
  auto released = store_lock_holder(dir.path());
  REQUIRE(released);
  CHECK_FALSE(released->has_value()); // the holder is gone
}

TEST_CASE("a directory's state changes when a file in it is written or its lease renewed, and not otherwise") {
  ashlar::test::temp_dir dir;
  std::ofstream{dir.file("000012.log")} << "records";
  auto first = directory_state(dir.path());
  REQUIRE(first);
  auto same = directory_state(dir.path());
  REQUIRE(same);
  CHECK(first->state == same->state);
  CHECK(first->bytes == 7); // "records"
  std::ofstream{dir.file("000012.log"), std::ios::app} << " more";
  auto grown = directory_state(dir.path());
  REQUIRE(grown);
  CHECK(grown->state != first->state);
  {
    auto lease = store_lease::take(dir.path(), "node test", 20);
    REQUIRE(lease);
    auto leased = directory_state(dir.path());
    REQUIRE(leased);
    while ((*lease)->renewals() < 3)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto renewed = directory_state(dir.path());
    REQUIRE(renewed);
    CHECK(renewed->state != leased->state);
  }
  auto missing = directory_state(dir.file("absent"));
  CHECK_FALSE(missing);
}
