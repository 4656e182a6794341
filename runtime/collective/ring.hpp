// Ring all-reduce (reduce-scatter, then all-gather; 2 (p - 1) steps, each moving 1/p of
// the tensor between neighbours), as one rank's state machine: the actor around it only
// moves ring_chunk messages to the next rank. Pure code.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// One step's message from a rank to the next one on the ring.
struct ring_chunk {
  uint32_t step = 0;  // 0 .. 2 (p - 1) - 1
  uint32_t chunk = 0; // which of the p chunks
  std::vector<float> data;
};

class ring_rank {
public:
  /// Rank `rank` of `ranks`, reducing `values` (the local tensor, already weighted, e.g.
  /// by this rank's share of the global batch). Chunk c is [c n / p, (c + 1) n / p).
  ring_rank(uint32_t rank, uint32_t ranks, std::vector<float> values);

  /// What to send to rank (rank + 1) % ranks for the current step, as a view of this
  /// rank's values (valid until the next receive()), or nothing when done (or with one
  /// rank). Send it once per step, then wait for receive().
  struct chunk_view {
    uint32_t step = 0;
    uint32_t chunk = 0;
    const float* data = nullptr;
    size_t size = 0;
  };
  std::optional<chunk_view> next_send() const;

  /// next_send(), copied into a message.
  std::optional<ring_chunk> outgoing() const;

  /// The previous rank's message for the current step: added (reduce-scatter) or copied
  /// (all-gather); the step advances. Fails with invalid_state for a message of another
  /// step or chunk, shape_mismatch for a wrong length.
  [[nodiscard]] caf::error receive(const ring_chunk& msg);

  /// receive() from a chunk held elsewhere (no copy into a ring_chunk).
  [[nodiscard]] caf::error receive(uint32_t step, uint32_t chunk, const float* data, size_t size);

  bool done() const { return step_ >= 2 * (ranks_ - 1); }
  /// The reduced tensor (complete once done()).
  const std::vector<float>& values() const { return values_; }

private:
  size_t begin(uint32_t c) const;
  size_t end(uint32_t c) const { return begin(c + 1); }
  uint32_t send_chunk(uint32_t step) const;

  uint32_t rank_, ranks_;
  uint32_t step_ = 0;
  std::vector<float> values_;
};

}  // namespace ashlar
