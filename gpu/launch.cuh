// Launch geometry shared by the CUDA kernel files: 256 threads a block, enough blocks to
// cover `count` elements with grid-stride loops (capped, so huge counts loop instead).
#pragma once

#include <cstddef>

namespace ashlar::gpu {

constexpr int threads = 256;

inline unsigned blocks_for(size_t count) {
  size_t b = (count + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535u * 32u ? (b == 0 ? 1 : b) : 65535u * 32u);
}

// for (i over [0, count)) spread over the grid.
#define ASHLAR_GRID_LOOP(i, count)                                                                          \
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (count); i += size_t{gridDim.x} * blockDim.x)

}  // namespace ashlar::gpu
