#include "apps/ashlar/bench_gpu.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>

#include <caf/all.hpp>

#include "actors/gpu_actor.hpp"
#include "actors/messages.hpp"
#include "gpu/cuda_backend.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/data/dataset.hpp"

namespace ashlar::cli {

namespace {

struct bench_system_config : caf::actor_system_config {
  bench_system_config() {
    actors::register_types(*this);
  }
};

// Samples/s of `backend` over `steps` steps after `warmup`, on synthetic batches.
expected<double> samples_per_second(compute_backend& backend, const dataset& data, const gpu_bench_options& o) {
  auto params = init_params(backend.spec(), 1);
  std::vector<float> grad(params.size());
  batch_cursor cursor{data, 0, data.n, 3};
  using clock = std::chrono::steady_clock;
  clock::time_point start;
  for (uint32_t i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup)
      start = clock::now();
    auto s = backend.train_step(params.data(), cursor.next(o.batch), grad.data());
    if (!s)
      return s.error();
  }
  const double secs = std::chrono::duration<double>(clock::now() - start).count();
  return static_cast<double>(o.steps) * o.batch / secs;
}

}  // namespace

void add_gpu_bench_options(CLI::App* cmd, gpu_bench_options& o) {
  cmd->add_option("--hidden", o.hidden, "hidden widths of each model to time (repeatable)")->capture_default_str();
  cmd->add_option("--batch", o.batch, "samples per step")->capture_default_str();
  cmd->add_option("--steps", o.steps, "timed steps per model")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--device", o.device, "CUDA device")->capture_default_str();
  cmd->add_flag("--tf32", o.tf32, "let cuBLAS use TF32 tensor cores");
  cmd->add_flag("--cpu", o.cpu, "also time the CPU backend on each model");
  cmd->add_option("--json", o.json, "append one JSON line per model to FILE");
}

int run_gpu_bench(const gpu_bench_options& o) {
  if (o.batch == 0 || o.steps == 0) {
    std::fprintf(stderr, "ashlar bench gpu: --batch and --steps must be at least 1\n");
    return 2;
  }
  bench_system_config cfg;
  caf::actor_system sys{cfg};
  auto pool = actors::gpu_pool::start(sys, std::to_string(o.device), o.tf32);
  if (!pool) {
    std::fprintf(stderr, "ashlar bench gpu: %s\n", describe(pool.error()).c_str());
    return 1;
  }
  std::printf("%-22s %6s %14s %9s %12s %12s %9s %12s\n", "model", "batch", "gpu samples/s", "step ms",
              "gemm TFLOP/s", "cuBLAS alone", "fraction", "cpu samples/s");
  for (const auto& hidden : o.hidden) {
    train_config tc;
    if (auto err = apply_setting(tc, "model.hidden", hidden)) {
      std::fprintf(stderr, "ashlar bench gpu: --hidden %s: %s\n", hidden.c_str(), describe(err).c_str());
      return 2;
    }
    const auto& spec = tc.model;
    auto data = make_synthetic(size_t{o.batch} * 8, spec.input, spec.classes, 7);
    // The worker's path: a backend whose calls the device's GPU actor runs.
    auto choice = (*pool)->next_worker()(spec);
    if (std::string{choice.backend->name()} == "cpu") {
      std::fprintf(stderr, "ashlar bench gpu: %s: computing %s\n", spec.to_string().c_str(), choice.note.c_str());
      return 1;
    }
    auto gpu_rate = samples_per_second(*choice.backend, data, o);
    choice.backend.reset();
    if (!gpu_rate) {
      std::fprintf(stderr, "ashlar bench gpu: %s\n", describe(gpu_rate.error()).c_str());
      return 1;
    }
    (*pool)->release(0);
    const auto shapes = gpu::step_gemms(spec, static_cast<int>(o.batch));
    double flops = 0;
    for (const auto& s : shapes)
      flops += s.flops();
    auto alone = gpu::time_gemms(shapes, o.device, o.tf32, 50);
    if (!alone) {
      std::fprintf(stderr, "ashlar bench gpu: %s\n", describe(alone.error()).c_str());
      return 1;
    }
    const double step_s = o.batch / *gpu_rate;
    const double gemm_tflops = flops / step_s * 1e-12, alone_tflops = flops / *alone * 1e-12;
    double cpu_rate = 0;
    if (o.cpu) {
      auto cpu = make_cpu_backend(spec);
      auto r = samples_per_second(*cpu, data, o);
      if (r)
        cpu_rate = *r;
    }
    std::printf("%-22s %6u %14.0f %9.3f %12.2f %12.2f %9.2f %12.0f\n", spec.to_string().c_str(), o.batch, *gpu_rate,
                step_s * 1e3, gemm_tflops, alone_tflops, gemm_tflops / alone_tflops, cpu_rate);
    if (!o.json.empty()) {
      std::ofstream out{o.json, std::ios::app};
      out << "{\"system\": \"ashlar\", \"model\": \"" << spec.to_string() << "\", \"batch\": " << o.batch
          << ", \"tf32\": " << (o.tf32 ? "true" : "false") << ", \"samples_per_second\": " << *gpu_rate
          << ", \"step_ms\": " << step_s * 1e3 << ", \"gemm_tflops\": " << gemm_tflops
          << ", \"cublas_alone_tflops\": " << alone_tflops << ", \"cpu_samples_per_second\": " << cpu_rate << "}\n";
      if (!out) {
        std::fprintf(stderr, "ashlar bench gpu: cannot write %s\n", o.json.c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace ashlar::cli
