// What the cluster does after a node did not serve a lost shard, and which requests ask
// for the same shard of the same job.
#include <catch2/catch.hpp>

#include <chrono>

#include "runtime/store/serve_again.hpp"

using namespace ashlar;

TEST_CASE("a node that did not serve a lost shard in time is asked again and a busy store is tried again later") {
  using ms = std::chrono::milliseconds;
  // No answer within the request's time: the node may still be restoring; the same node,
  // at once (the new request waits behind the restore on that node).
  auto timed_out = after_failed_serve(serve_failure::timed_out, true);
  CHECK(timed_out.target == serve_retry::same_node);
  CHECK(timed_out.after == ms{0});
  // A store another process holds: any server node, after 2 s (a takeover needs the lease
  // seen unchanged across tries).
  auto busy = after_failed_serve(serve_failure::busy, true);
  CHECK(busy.target == serve_retry::any_node);
  CHECK(busy.after == ms{2000});
  // A refusal: nobody is asked again.
  CHECK(after_failed_serve(serve_failure::refused, true).target == serve_retry::nobody);
  // The node left the cluster meanwhile, whatever it answered: the next server node.
  for (auto why : {serve_failure::busy, serve_failure::timed_out, serve_failure::refused}) {
    auto gone = after_failed_serve(why, false);
    CHECK(gone.target == serve_retry::any_node);
    CHECK(gone.after == ms{500});
  }
}

TEST_CASE("a request to serve a shard again is the same shard of the same job whatever its initial parameters") {
  wire::spawn_shard a;
  a.range = shard_range{1, 10, 20};
  a.params = std::vector<float>(10, 1.0f);
  a.policy = "ashl";
  a.lr = 0.1f;
  a.momentum = 0.9f;
  a.data_key = "k";
  a.checkpoint_dir = "ck";
  a.job = "5f3a9c21";
  auto b = a;
  b.params = std::vector<float>(10, 2.0f);
  b.resume = true;
  CHECK(same_shard_of_job(a, b));
  // Any other field differs: another shard, or another job's.
  auto other = [&](auto change) {
    auto c = a;
    change(c);
    return !same_shard_of_job(a, c);
  };
  CHECK(other([](wire::spawn_shard& c) { c.range.shard_id = 2; }));
  CHECK(other([](wire::spawn_shard& c) { c.range.end = 21; }));
  CHECK(other([](wire::spawn_shard& c) { c.policy = "adsp"; }));
  CHECK(other([](wire::spawn_shard& c) { c.lr = 0.2f; }));
  CHECK(other([](wire::spawn_shard& c) { c.momentum = 0.0f; }));
  CHECK(other([](wire::spawn_shard& c) { c.weight_decay = 1e-4f; }));
  CHECK(other([](wire::spawn_shard& c) { c.staleness_aware_lr = true; }));
  CHECK(other([](wire::spawn_shard& c) { c.staleness_bound = 3; }));
  CHECK(other([](wire::spawn_shard& c) { c.k = 2; }));
  CHECK(other([](wire::spawn_shard& c) { c.data_key = "another job"; }));
  CHECK(other([](wire::spawn_shard& c) { c.checkpoint_dir = "elsewhere"; }));
  CHECK(other([](wire::spawn_shard& c) { c.checkpoint_keep = 5; }));
  CHECK(other([](wire::spawn_shard& c) { c.average_samples = 4000; }));
  // A later job with the same settings (resumed from the same store): another job.
  CHECK(other([](wire::spawn_shard& c) { c.job = "0b81d4e7"; }));
  // Requests without a job id (an older scheduler's) compare by their settings alone.
  auto old_a = a, old_b = b;
  old_a.job.clear();
  old_b.job.clear();
  CHECK(same_shard_of_job(old_a, old_b));
}
