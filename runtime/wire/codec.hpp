// Encoding of wire messages as Cap'n Proto (schema/ashlar.capnp) in 8-byte words, and
// checked decoding: a decoder validates every length and enum before the receiver
// touches the data, and fails with malformed_message naming the message type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar::wire {

/// Largest message a decoder accepts, in bytes. Default: 1 GiB (CAF's limit is ~2 GB).
constexpr size_t max_message_bytes = size_t{1} << 30;

/// A Cap'n Proto message in 8-byte words.
using words = std::vector<uint64_t, uninitialized_allocator<uint64_t>>;

#define ASHLAR_WIRE_CODEC(type)                                                              \
  words encode(const type& x);                                                               \
  [[nodiscard]] caf::error decode(const uint64_t* data, size_t num_words, type& out);

ASHLAR_WIRE_CODEC(hello)
ASHLAR_WIRE_CODEC(welcome)
ASHLAR_WIRE_CODEC(spawn_shard)
ASHLAR_WIRE_CODEC(spawn_worker)
ASHLAR_WIRE_CODEC(job_request)
ASHLAR_WIRE_CODEC(job_result)
ASHLAR_WIRE_CODEC(ctl_request)
ASHLAR_WIRE_CODEC(cluster_status)
ASHLAR_WIRE_CODEC(register_worker)
ASHLAR_WIRE_CODEC(assignment)
ASHLAR_WIRE_CODEC(membership_change)
ASHLAR_WIRE_CODEC(pull_request)
ASHLAR_WIRE_CODEC(pull_reply)
ASHLAR_WIRE_CODEC(push)
ASHLAR_WIRE_CODEC(push_ack)
ASHLAR_WIRE_CODEC(ring_message)
ASHLAR_WIRE_CODEC(shard_status)
ASHLAR_WIRE_CODEC(profile_report)
ASHLAR_WIRE_CODEC(cluster_stats)

#undef ASHLAR_WIRE_CODEC

/// Decodes from a word vector.
template <class T>
[[nodiscard]] caf::error decode(const words& w, T& out) {
  return decode(w.data(), w.size(), out);
}

}  // namespace ashlar::wire
