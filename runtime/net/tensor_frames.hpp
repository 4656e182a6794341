// The tensor data plane's framing: pulls and pushes between a worker and a server shard,
// and a ring all-reduce's chunks from one worker to the next, on a direct connection
// (TCP, or shared memory on one host) beside CAF's middleman (which carries everything
// else).
//
// A frame is a 32-byte header {magic, kind, seq, meta_bytes, payload_bytes}, the message
// without its tensor as Cap'n Proto words (the same schema as on CAF's wire), and the
// tensor as raw little-endian floats: written from and read into the message's own
// vector, with no copy in user space. `seq` pairs a reply with its request; replies may
// come in any order (a shard holds reads back while its policy says wait).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/net/byte_channel.hpp"
#include "runtime/wire/codec.hpp"
#include "runtime/wire/messages.hpp"

namespace ashlar::net {

/// "ASHD": the first four bytes of every frame.
constexpr uint32_t frame_magic = 0x44485341u;

/// Largest metadata part a receiver accepts. Default: 1 MiB.
constexpr uint64_t max_meta_bytes = uint64_t{1} << 20;

enum class frame_kind : uint32_t {
  hello = 1,      // client -> node: meta "<protocol> <shard id>" or "<protocol> ring <worker id>", then
                  // the shared-memory offer, if any
  welcome = 2,    // node -> client: accepted
  pull = 3,       // wire::pull_request
  pull_reply = 4, // wire::pull_reply, params as payload
  push = 5,       // wire::push, grad as payload
  push_ack = 6,   // wire::push_ack
  error = 7,      // meta: the error as text (a refused hello, a failed request)
  ring = 8,       // wire::ring_message, its chunk as payload (worker -> the next on the ring)
};

/// One received frame, decoded. Only the member that `kind` names is filled.
struct inbound_frame {
  frame_kind kind = frame_kind::error;
  uint64_t seq = 0;
  std::string text; // hello, error
  wire::pull_request pull;
  wire::pull_reply reply;
  wire::push push;
  wire::push_ack ack;
  wire::ring_message ring;
};

/// Reads one frame. A bad magic, unknown kind, oversized or malformed part fails with
/// malformed_message naming the peer; a closed connection with peer_unreachable.
/// A frame announcing a tensor of more than `max_payload` bytes fails before anything is
/// allocated for it (a shard node passes what its shard's range can take).
/// `before_payload`, if given, is called with a tensor's byte count once its header
/// passed these checks and before its buffer is allocated; its error ends the read.
[[nodiscard]] caf::error read_frame(byte_channel& sock, inbound_frame& out,
                                    uint64_t max_payload = wire::max_message_bytes,
                                    const std::function<caf::error(uint64_t)>& before_payload = {});

/// Writes one frame. The message's tensor (params or grad) is sent from its vector, which
/// is left as it was.
[[nodiscard]] caf::error write_frame(byte_channel& sock, uint64_t seq, const wire::pull_request& x);
[[nodiscard]] caf::error write_frame(byte_channel& sock, uint64_t seq, wire::pull_reply& x);
[[nodiscard]] caf::error write_frame(byte_channel& sock, uint64_t seq, wire::push& x);
[[nodiscard]] caf::error write_frame(byte_channel& sock, uint64_t seq, const wire::push_ack& x);
[[nodiscard]] caf::error write_frame(byte_channel& sock, uint64_t seq, wire::ring_message& x);
[[nodiscard]] caf::error write_text_frame(byte_channel& sock, frame_kind kind, uint64_t seq,
                                          const std::string& text);

}  // namespace ashlar::net
