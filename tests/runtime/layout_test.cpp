#include <catch2/catch.hpp>

#include <vector>

#include "runtime/model/mlp.hpp"
#include "runtime/tensor/layout.hpp"

using namespace ashlar;

TEST_CASE("the shard split covers every parameter exactly once") {
  for (uint64_t n : {1ull, 7ull, 10ull, 1000ull, 235146ull}) {
    for (uint32_t s : {1u, 2u, 3u, 7u}) {
      if (s > n)
        continue;
      auto ranges = split_ranges(n, s);
      REQUIRE(ranges);
      REQUIRE(ranges->size() == s);
      std::vector<int> hits(n, 0);
      uint64_t smallest = n, largest = 0;
      for (uint32_t i = 0; i < s; ++i) {
        const auto& r = (*ranges)[i];
        CHECK(r.shard_id == i);
        CHECK(r.begin < r.end);
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
        for (uint64_t p = r.begin; p < r.end; ++p)
          hits[p]++;
      }
      CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
      CHECK(largest - smallest <= 1);
    }
  }
}

TEST_CASE("more shards than parameters is refused with a clear error") {
  auto r = split_ranges(5, 6);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::invalid_config));
  CHECK(describe(r.error()).find("exceeds the model's 5 parameters") != std::string::npos);
  CHECK_FALSE(split_ranges(5, 0));
}

TEST_CASE("the MLP layout places each layer's weights then bias contiguously") {
  mlp_spec spec;
  spec.input = 4;
  spec.hidden = {3};
  spec.classes = 2;
  auto layers = layer_layout(spec);
  REQUIRE(layers.size() == 2);
  CHECK(layers[0].weight == 0);
  CHECK(layers[0].bias == 12);
  CHECK(layers[1].weight == 15);
  CHECK(layers[1].bias == 21);
  CHECK(spec.num_params() == 23);
  CHECK(spec.to_string() == "4-3-2");
}
