// Random heterogeneity profiles: seeded, within their bounds, heterogeneous, and readable
// back as contention files.
#include <catch2/catch.hpp>

#include <algorithm>

#include "runtime/pacing/random_profiles.hpp"

using namespace ashlar;

TEST_CASE("random profiles are seeded, have 4-8 workers at speeds 1-8 with a slowest at 1 and one at 3 or more, and "
          "some have contention that parses back") {
  auto a = random_profiles(40, 7), b = random_profiles(40, 7), c = random_profiles(40, 8);
  REQUIRE(a.size() == 40);
  size_t with_contention = 0;
  bool differ = false;
  for (size_t k = 0; k < a.size(); ++k) {
    const auto& p = a[k];
    CHECK(p.speeds_text() == b[k].speeds_text());
    CHECK(p.contention_text() == b[k].contention_text());
    differ = differ || p.speeds_text() != c[k].speeds_text();
    CHECK(p.speeds.size() >= 4);
    CHECK(p.speeds.size() <= 8);
    CHECK(*std::min_element(p.speeds.begin(), p.speeds.end()) == 1);
    CHECK(*std::max_element(p.speeds.begin(), p.speeds.end()) >= 3);
    CHECK(*std::max_element(p.speeds.begin(), p.speeds.end()) <= 8);
    if (p.contention.empty())
      continue;
    ++with_contention;
    auto parsed = parse_contention(p.contention_text(), "profile");
    REQUIRE(parsed);
    REQUIRE(parsed->size() == p.contention.size());
    for (const auto& iv : *parsed) {
      CHECK(iv.worker < p.speeds.size());
      CHECK(iv.end_s > iv.start_s);
      CHECK(iv.factor >= 2);
      CHECK(iv.factor <= 4);
    }
  }
  CHECK(differ);
  CHECK(with_contention > 5);
  CHECK(with_contention < 35);
}

TEST_CASE("the bench's profiles option takes random:N and names the form otherwise") {
  CHECK(*parse_profiles_spec("random:8") == 8);
  for (auto bad : {"random:", "random:0", "random:x", "8", "random:1000", "fixed:3"}) {
    auto r = parse_profiles_spec(bad);
    REQUIRE_FALSE(r);
    CHECK(describe(r.error()).find("expected random:N") != std::string::npos);
  }
}
