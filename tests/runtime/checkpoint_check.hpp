// Test helper: a checkpoint directory as a resume would find it.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "runtime/store/checkpoint.hpp"

namespace ashlar::test {

/// The newest checkpoint of shards 0 .. shards-1 in `dir`, checked the way a resume loads
/// it: the LATEST pointer's record must decode and match its checksum (no fallback), and
/// every stored record must be intact. A shard killed before its first checkpoint has none.
/// Returns how many of the shards had a checkpoint.
inline uint32_t check_consistent(const std::string& dir, uint32_t shards) {
  uint32_t found = 0;
  for (uint32_t id = 0; id < shards; ++id) {
    auto store = open_rocksdb_store(dir + "/shard-" + std::to_string(id), open_mode::existing);
    REQUIRE(store);
    auto latest = (*store)->get("shard/" + std::to_string(id) + "/latest");
    REQUIRE(latest);
    if (!*latest)
      continue;
    ++found;
    checkpoint_log log{**store, id, 3};
    auto c = log.load(std::stoull(**latest));
    INFO("shard " << id << " LATEST " << **latest);
    REQUIRE(c);
    CHECK(c->version == std::stoull(**latest));
    auto all = log.list();
    REQUIRE(all);
    for (const auto& i : *all)
      CHECK(i.intact);
  }
  return found;
}

}  // namespace ashlar::test
