// The matrix products of a training step, as gpu/cuda_backend.cpp issues them (built
// with or without CUDA: benchmarks count FLOPs from it).
#include "gpu/bench_timers.hpp"
#include "gpu/cuda_backend.hpp"

namespace ashlar::gpu {

std::vector<gemm_shape> step_gemms(const mlp_spec& spec, int rows) {
  std::vector<gemm_shape> out;
  const auto layers = layer_layout(spec);
  for (const auto& L : layers) // forward: act^T = W . in^T
    out.push_back({true, false, static_cast<int>(L.out), rows, static_cast<int>(L.in)});
  for (size_t i = layers.size(); i-- > 0;) {
    const auto& L = layers[i];
    out.push_back({false, true, static_cast<int>(L.in), static_cast<int>(L.out), rows}); // dW^T = in^T . delta
    if (i > 0)
      out.push_back({false, false, static_cast<int>(L.in), rows, static_cast<int>(L.out)}); // delta_prev^T
  }
  return out;
}

}  // namespace ashlar::gpu
