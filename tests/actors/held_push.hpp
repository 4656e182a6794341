// Test support: a push whose worker's read follows it (wire::push::read_follows), sent to a
// shard or its data-plane stand-in as a worker's step sends it, and the answers it gets.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "actors/interfaces.hpp"

namespace ashlar::test {

/// Sends `p` (as read_follows) and worker p.worker_id's next read right behind it, from `self`.
inline void push_then_read(caf::scoped_actor& self, const actors::shard_actor& to, wire::push p) {
  p.read_follows = true;
  self->send(to, p);
  self->send(to, wire::pull_request{p.worker_id, p.shard_id, false});
}

/// Whether a read's reply or a push's acknowledgement reaches `self` within `wait`.
inline bool answered_within(caf::scoped_actor& self, std::chrono::milliseconds wait) {
  bool any = false;
  self->receive([&](const wire::pull_reply&) { any = true; }, [&](const wire::push_ack&) { any = true; },
                caf::after(wait) >> [] {});
  return any;
}

/// The next two answers to reach `self` ("reply", "ack"), in order, each handed to its check.
inline std::vector<std::string> next_answers(caf::scoped_actor& self,
                                             const std::function<void(const wire::pull_reply&)>& on_reply,
                                             const std::function<void(const wire::push_ack&)>& on_ack) {
  std::vector<std::string> order;
  for (int i = 0; i < 2; ++i)
    self->receive(
      [&](const wire::pull_reply& r) {
        order.push_back("reply");
        on_reply(r);
      },
      [&](const wire::push_ack& a) {
        order.push_back("ack");
        on_ack(a);
      },
      caf::after(std::chrono::seconds(5)) >> [] { FAIL("no answer"); });
  return order;
}

}  // namespace ashlar::test
