#include "runtime/net/tensor_frames.hpp"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "runtime/wire/codec.hpp"

namespace ashlar::net {

namespace {

struct frame_header {
  uint32_t magic = frame_magic;
  uint32_t kind = 0;
  uint64_t seq = 0;
  uint64_t meta_bytes = 0;
  uint64_t payload_bytes = 0;
};
static_assert(sizeof(frame_header) == 32);

// The payload may come in two parts (a sparse push: its values, then its indices).
caf::error write_parts(byte_channel& sock, frame_kind kind, uint64_t seq, const void* meta, size_t meta_n,
                       const void* payload, size_t payload_n, const void* payload2 = nullptr,
                       size_t payload2_n = 0) {
  frame_header h;
  h.kind = static_cast<uint32_t>(kind);
  h.seq = seq;
  h.meta_bytes = meta_n;
  h.payload_bytes = payload_n + payload2_n;
  iovec iov[4] = {{&h, sizeof h},
                  {const_cast<void*>(meta), meta_n},
                  {const_cast<void*>(payload), payload_n},
                  {const_cast<void*>(payload2), payload2_n}};
  return sock.write_all(iov, payload2_n > 0 ? 4 : payload_n > 0 ? 3 : 2);
}

template <class T>
caf::error write_message(byte_channel& sock, frame_kind kind, uint64_t seq, const T& x) {
  auto w = wire::encode(x);
  return write_parts(sock, kind, seq, w.data(), w.size() * sizeof(uint64_t), nullptr, 0);
}

// Sends x with its tensor as the payload; the tensor is moved out for the encoding and
// moved back, so it is neither copied nor lost.
template <class T, class Tensor>
caf::error write_with_tensor(byte_channel& sock, frame_kind kind, uint64_t seq, T& x,
                             Tensor T::*tensor) {
  Tensor t = std::move(x.*tensor);
  x.*tensor = {};
  auto w = wire::encode(x);
  x.*tensor = std::move(t);
  const auto& data = x.*tensor;
  return write_parts(sock, kind, seq, w.data(), w.size() * sizeof(uint64_t), data.data(),
                     data.size() * sizeof(float));
}

// A sparse payload is k values, then their k indices: the indices move to `index`, the
// values stay.
caf::error split_sparse(wire::shared_tensor& payload, std::vector<uint32_t>& index, const char* what) {
  if (payload.size() % 2 != 0)
    return make_error(errc::malformed_message, std::string{"a "} + what + " payload of an odd number of words");
  const size_t k = payload.size() / 2;
  index.resize(k);
  if (k > 0) // an empty sparse tensor has no buffer to copy from
    std::memcpy(index.data(), payload.data() + k, k * sizeof(uint32_t));
  payload = payload.window(0, k);
  return {};
}

// A payload of n floats: a view of the peer's buffer where it shares it, a copy otherwise.
caf::error read_payload(byte_channel& sock, size_t bytes, wire::shared_tensor& out) {
  const size_t n = bytes / sizeof(float);
  if (auto view = sock.read_view(bytes)) {
    out = wire::shared_tensor{std::shared_ptr<const float>(view, static_cast<const float*>(view.get())), n};
    return {};
  }
  return sock.read_exact(out.reset(n), bytes);
}

// Sends a sparse message: values and indices both travel as payload, beside metadata
// that holds neither; both are moved out for the encoding and moved back.
template <class T, class Values>
caf::error write_sparse(byte_channel& sock, frame_kind kind, uint64_t seq, T& x, Values T::*values) {
  if (x.index.size() != (x.*values).size())
    return make_error(errc::shape_mismatch, "a sparse message with " + std::to_string(x.index.size())
                                              + " indices and " + std::to_string((x.*values).size()) + " values");
  Values v = std::move(x.*values);
  std::vector<uint32_t> index = std::move(x.index);
  x.*values = {};
  x.index = {};
  auto w = wire::encode(x);
  x.*values = std::move(v);
  x.index = std::move(index);
  return write_parts(sock, kind, seq, w.data(), w.size() * sizeof(uint64_t), (x.*values).data(),
                     (x.*values).size() * sizeof(float), x.index.data(), x.index.size() * sizeof(uint32_t));
}

caf::error malformed(const byte_channel& sock, const std::string& what) {
  return make_error(errc::malformed_message, "data connection with " + sock.peer() + ": " + what);
}

} // namespace

caf::error read_frame(byte_channel& sock, inbound_frame& out, uint64_t max_payload,
                      const std::function<caf::error(uint64_t)>& before_payload) {
  frame_header h;
  if (auto err = sock.read_exact(&h, sizeof h))
    return err;
  if (h.magic != frame_magic)
    return malformed(sock, "bad frame magic (not an Ashlar data-plane peer?)");
  if (h.kind < static_cast<uint32_t>(frame_kind::hello) || h.kind > static_cast<uint32_t>(frame_kind::ring))
    return malformed(sock, "unknown frame kind " + std::to_string(h.kind));
  if (h.meta_bytes > max_meta_bytes)
    return malformed(sock, "metadata of " + std::to_string(h.meta_bytes) + " bytes (limit "
                             + std::to_string(max_meta_bytes) + ")");
  if (h.payload_bytes > std::min<uint64_t>(max_payload, wire::max_message_bytes) || h.payload_bytes % sizeof(float) != 0)
    return malformed(sock, "tensor payload of " + std::to_string(h.payload_bytes) + " bytes (at most "
                             + std::to_string(std::min<uint64_t>(max_payload, wire::max_message_bytes)) + ")");
  out.kind = static_cast<frame_kind>(h.kind);
  out.seq = h.seq;
  const bool takes_payload =
    out.kind == frame_kind::pull_reply || out.kind == frame_kind::push || out.kind == frame_kind::ring;
  if (!takes_payload && h.payload_bytes != 0)
    return malformed(sock, "unexpected tensor payload on a frame of kind " + std::to_string(h.kind));
  if (out.kind == frame_kind::hello || out.kind == frame_kind::welcome || out.kind == frame_kind::error) {
    out.text.resize(h.meta_bytes);
    return sock.read_exact(out.text.data(), h.meta_bytes);
  }
  if (h.meta_bytes % sizeof(uint64_t) != 0)
    return malformed(sock, "metadata is not whole 8-byte words");
  wire::words meta(h.meta_bytes / sizeof(uint64_t));
  if (auto err = sock.read_exact(meta.data(), h.meta_bytes))
    return err;
  wire::shared_tensor tensor;
  if (h.payload_bytes > 0 && before_payload)
    if (auto err = before_payload(h.payload_bytes))
      return err;
  out.ring.data.clear();
  if (h.payload_bytes > 0 && out.kind == frame_kind::ring) { // summed into: a buffer of its own
    out.ring.data.resize(h.payload_bytes / sizeof(float));
    if (auto err = sock.read_exact(out.ring.data.data(), h.payload_bytes))
      return err;
  } else if (h.payload_bytes > 0) {
    if (auto err = read_payload(sock, h.payload_bytes, tensor))
      return err;
  }
  caf::error err;
  switch (out.kind) {
    case frame_kind::pull:
      err = wire::decode(meta, out.pull);
      break;
    case frame_kind::pull_reply:
      err = wire::decode(meta, out.reply);
      if (!err && out.reply.sparse)
        err = split_sparse(tensor, out.reply.index, "delta read");
      out.reply.params = std::move(tensor);
      break;
    case frame_kind::push:
      err = wire::decode(meta, out.push);
      if (!err && out.push.sparse)
        err = split_sparse(tensor, out.push.index, "sparse push");
      out.push.grad = std::move(tensor);
      break;
    case frame_kind::push_ack:
      err = wire::decode(meta, out.ack);
      break;
    case frame_kind::ring:
      {
        wire::tensor data = std::move(out.ring.data);
        err = wire::decode(meta, out.ring);
        out.ring.data = std::move(data);
      }
      break;
    default:
      break;
  }
  if (err)
    return malformed(sock, describe(err));
  return {};
}

caf::error write_frame(byte_channel& sock, uint64_t seq, const wire::pull_request& x) {
  return write_message(sock, frame_kind::pull, seq, x);
}

caf::error write_frame(byte_channel& sock, uint64_t seq, wire::pull_reply& x) {
  if (x.sparse)
    return write_sparse(sock, frame_kind::pull_reply, seq, x, &wire::pull_reply::params);
  return write_with_tensor(sock, frame_kind::pull_reply, seq, x, &wire::pull_reply::params);
}

caf::error write_frame(byte_channel& sock, uint64_t seq, wire::push& x) {
  if (x.sparse)
    return write_sparse(sock, frame_kind::push, seq, x, &wire::push::grad);
  return write_with_tensor(sock, frame_kind::push, seq, x, &wire::push::grad);
}

caf::error write_frame(byte_channel& sock, uint64_t seq, const wire::push_ack& x) {
  return write_message(sock, frame_kind::push_ack, seq, x);
}

caf::error write_frame(byte_channel& sock, uint64_t seq, wire::ring_message& x) {
  return write_with_tensor(sock, frame_kind::ring, seq, x, &wire::ring_message::data);
}

caf::error write_text_frame(byte_channel& sock, frame_kind kind, uint64_t seq, const std::string& text) {
  return write_parts(sock, kind, seq, text.data(), text.size(), nullptr, 0);
}

}  // namespace ashlar::net
