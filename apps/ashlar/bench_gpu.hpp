// `ashlar bench gpu`: one GPU worker's training step (through its GPU actor, parameters
// in and gradient out as a worker uses it) in samples/s, per model, and its matrix
// products' FLOP rate against what cuBLAS reaches alone on the same shapes, and its
// local steps with the model kept on the device (as under adsp and ashl).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ashlar::cli {

struct gpu_bench_options {
  std::vector<std::string> hidden = {"256,128", "4096,4096"};
  std::vector<std::string> configs; // models of these config files too (any layers)
  uint32_t batch = 256;
  uint32_t steps = 200;
  uint32_t warmup = 20;
  int device = 0;
  bool tf32 = false;
  bool cpu = false; // also time the CPU backend (slow for wide models)
  std::string json; // append one JSON line per model to this file
};

void add_gpu_bench_options(CLI::App* cmd, gpu_bench_options& o);
int run_gpu_bench(const gpu_bench_options& o);

}  // namespace ashlar::cli
