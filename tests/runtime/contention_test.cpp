#include <catch2/catch.hpp>

#include "runtime/pacing/contention.hpp"

using namespace ashlar;

TEST_CASE("a contention profile slows the named workers during their intervals") {
  auto p = parse_contention("# worker start end factor\n"
                            "1 2.0 5.0 3   # worker 1 is 3x slower from 2 s to 5 s\n"
                            "* 4 6 2\n",
                            "c.txt");
  REQUIRE(p);
  REQUIRE(p->size() == 2);
  CHECK(slowdown(*p, 1, 1.0) == 1.0);
  CHECK(slowdown(*p, 1, 2.0) == 3.0);
  CHECK(slowdown(*p, 1, 4.5) == 6.0); // both intervals
  CHECK(slowdown(*p, 0, 4.5) == 2.0);
  CHECK(slowdown(*p, 0, 6.0) == 1.0); // end is exclusive
  auto mine = for_worker(*p, 0);
  REQUIRE(mine.size() == 1);
  CHECK(slowdown(mine, 0, 5.0) == 2.0);
}

TEST_CASE("a malformed contention profile names the file and line") {
  auto p = parse_contention("0 1 2 2\n0 3 1 2\n", "prof.txt");
  REQUIRE_FALSE(p);
  CHECK(describe(p.error()).find("prof.txt:2") != std::string::npos);
  CHECK_FALSE(parse_contention("x 1 2 2\n", "p"));
  CHECK_FALSE(parse_contention("0 1 2\n", "p"));
  CHECK_FALSE(parse_contention("0 1 2 0.5\n", "p")); // a speed-up is not contention
  CHECK(is(load_contention("/nonexistent/profile").error(), errc::io_error));
}
