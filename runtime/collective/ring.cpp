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

std::optional<ring_chunk> ring_rank::outgoing() const {
  if (done())
    return std::nullopt;
  ring_chunk m;
  m.step = step_;
  m.chunk = send_chunk(step_);
  m.data.assign(values_.begin() + static_cast<std::ptrdiff_t>(begin(m.chunk)),
                values_.begin() + static_cast<std::ptrdiff_t>(end(m.chunk)));
  return m;
}

caf::error ring_rank::receive(const ring_chunk& msg) {
  if (done() || msg.step != step_)
    return make_error(errc::invalid_state, "ring rank " + std::to_string(rank_) + ": a message for step "
                                             + std::to_string(msg.step) + " at step " + std::to_string(step_));
  // The previous rank sends what it computes for this step.
  const uint32_t prev = (rank_ + ranks_ - 1) % ranks_;
  ring_rank peer{prev, ranks_, {}};
  if (msg.chunk != peer.send_chunk(step_))
    return make_error(errc::invalid_state, "ring rank " + std::to_string(rank_) + ": chunk "
                                             + std::to_string(msg.chunk) + " at step " + std::to_string(step_)
                                             + ", expected " + std::to_string(peer.send_chunk(step_)));
  const size_t b = begin(msg.chunk), e = end(msg.chunk);
  if (msg.data.size() != e - b)
    return make_error(errc::shape_mismatch, "ring rank " + std::to_string(rank_) + ": chunk "
                                              + std::to_string(msg.chunk) + " of " + std::to_string(msg.data.size())
                                              + " floats, expected " + std::to_string(e - b));
  if (step_ < ranks_ - 1)
    for (size_t i = b; i < e; ++i)
      values_[i] += msg.data[i - b];
  else
    for (size_t i = b; i < e; ++i)
      values_[i] = msg.data[i - b];
  ++step_;
  return {};
}

}  // namespace ashlar
