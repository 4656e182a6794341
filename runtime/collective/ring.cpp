#include "runtime/collective/ring.hpp"

namespace ashlar {

ring_rank::ring_rank(uint32_t rank, uint32_t ranks, std::vector<float> values)
  : rank_(rank), ranks_(ranks == 0 ? 1 : ranks), values_(std::move(values)) {
}

size_t ring_rank::begin(uint32_t c) const {
  return values_.size() * c / ranks_;
}

// Reduce-scatter step s: send chunk (rank - s) mod p; all-gather step p - 1 + s: send
// chunk (rank + 1 - s) mod p, which this rank holds complete.
uint32_t ring_rank::send_chunk(uint32_t step) const {
  const uint32_t p = ranks_;
  if (step < p - 1)
    return (rank_ + p - step % p) % p;
  uint32_t s = step - (p - 1);
  return (rank_ + 1 + p - s % p) % p;
}

std::optional<ring_rank::chunk_view> ring_rank::next_send() const {
  if (done())
    return std::nullopt;
  const uint32_t c = send_chunk(step_);
  return chunk_view{step_, c, values_.data() + begin(c), end(c) - begin(c)};
}

std::optional<ring_chunk> ring_rank::outgoing() const {
  auto v = next_send();
  if (!v)
    return std::nullopt;
  return ring_chunk{v->step, v->chunk, std::vector<float>(v->data, v->data + v->size)};
}

caf::error ring_rank::receive(const ring_chunk& msg) {
  return receive(msg.step, msg.chunk, msg.data.data(), msg.data.size());
}

caf::error ring_rank::receive(uint32_t msg_step, uint32_t msg_chunk, const float* data, size_t size) {
  if (done() || msg_step != step_)
    return make_error(errc::invalid_state, "ring rank " + std::to_string(rank_) + ": a message for step "
                                             + std::to_string(msg_step) + " at step " + std::to_string(step_));
  // The previous rank sends what it computes for this step.
  const uint32_t prev = (rank_ + ranks_ - 1) % ranks_;
  ring_rank peer{prev, ranks_, {}};
  if (msg_chunk != peer.send_chunk(step_))
    return make_error(errc::invalid_state, "ring rank " + std::to_string(rank_) + ": chunk "
                                             + std::to_string(msg_chunk) + " at step " + std::to_string(step_)
                                             + ", expected " + std::to_string(peer.send_chunk(step_)));
  const size_t b = begin(msg_chunk), e = end(msg_chunk);
  if (size != e - b)
    return make_error(errc::shape_mismatch, "ring rank " + std::to_string(rank_) + ": chunk "
                                              + std::to_string(msg_chunk) + " of " + std::to_string(size)
                                              + " floats, expected " + std::to_string(e - b));
  if (step_ < ranks_ - 1)
    for (size_t i = b; i < e; ++i)
      values_[i] += data[i - b];
  else
    for (size_t i = b; i < e; ++i)
      values_[i] = data[i - b];
  ++step_;
  return {};
}

}  // namespace ashlar
