// Test helper: a checkpoint directory as a resume would find it.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "runtime/store/checkpoint.hpp"

namespace ashlar::test {

/// Checks shards 0 .. shards-1 of `dir` the way a resume finds them: every stored record
/// decodes and matches its checksum, and the job record's newest cut is on every shard
/// (a cut is committed only once every shard has it). With `same_version` (a lockstep
/// policy), every shard holds that cut at one version: one round of the model. A job
/// killed before its first commit has only its start record (cut 0). Returns how many of the shards had a cut.
inline uint32_t check_consistent(const std::string& dir, uint32_t shards, bool same_version = false) {
  auto job = open_rocksdb_store(dir + "/job", open_mode::existing);
  REQUIRE(job);
  auto committed = load_job_cuts(**job);
  REQUIRE(committed);
  uint32_t found = 0;
  std::vector<uint64_t> versions;
  for (uint32_t id = 0; id < shards; ++id) {
    auto store = open_rocksdb_store(dir + "/shard-" + std::to_string(id), open_mode::existing);
    REQUIRE(store);
    checkpoint_log log{**store, id, 3};
    auto all = log.list();
    REQUIRE(all);
    for (const auto& i : *all) {
      INFO("shard " << id << " cut " << i.cut << ": " << i.problem);
      CHECK(i.intact);
    }
    auto cuts = log.intact_cuts();
    REQUIRE(cuts);
    found += cuts->empty() ? 0 : 1;
    if (committed->empty() || committed->front().cut == 0)
      continue; // none committed (0: the job's start record)
    const auto newest = committed->front().cut;
    INFO("shard " << id << " and the job record's newest cut " << newest);
    REQUIRE(std::find(cuts->begin(), cuts->end(), newest) != cuts->end());
    auto c = log.load(newest);
    REQUIRE(c);
    versions.push_back(c->version);
  }
  if (same_version && !versions.empty())
    CHECK(std::count(versions.begin(), versions.end(), versions.front()) == static_cast<long>(versions.size()));
  return found;
}

}  // namespace ashlar::test
