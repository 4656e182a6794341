#include "apps/ashlar/bench_gpu.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>

#include <caf/all.hpp>

#include "actors/gpu_actor.hpp"
#include "actors/interfaces.hpp"
#include "gpu/bench_timers.hpp"
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

// Samples/s of `step(i, batch)` over o.steps steps after o.warmup, on batches of `data`.
template <class Step>
expected<double> timed_steps(const dataset& data, const gpu_bench_options& o, Step&& step) {
  batch_cursor cursor{data, 0, data.n, 3};
  using clock = std::chrono::steady_clock;
  clock::time_point start;
  for (uint32_t i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup)
      start = clock::now();
    auto s = step(i, cursor.next(o.batch));
    if (!s)
      return s.error();
  }
  const double secs = std::chrono::duration<double>(clock::now() - start).count();
  return static_cast<double>(o.steps) * o.batch / secs;
}

// Training steps of `backend`: parameters in, gradient out.
expected<double> samples_per_second(compute_backend& backend, const dataset& data, const gpu_bench_options& o) {
  auto params = init_params(backend.spec(), 1);
  std::vector<float> grad(params.size());
  // As a worker does: its parameter and gradient buffers locked for the backend's DMA.
  auto lock_params = backend.lock_host_memory(params.data(), params.size() * sizeof(float));
  auto lock_grad = backend.lock_host_memory(grad.data(), grad.size() * sizeof(float));
  return timed_steps(data, o, [&](uint32_t, batch_view b) { return backend.train_step(params.data(), b, grad.data()); });
}

// Samples/s of local steps on the model `backend` keeps (sent once, as after a pull),
// over `steps` steps after `warmup`.
expected<double> kept_samples_per_second(compute_backend& backend, const dataset& data, const gpu_bench_options& o) {
  auto params = init_params(backend.spec(), 1);
  return timed_steps(data, o, [&](uint32_t i, batch_view b) {
    return backend.local_step(i == 0 ? params.data() : nullptr, nullptr, nullptr, b, 1e-4f, 0.5f);
  });
}

// Says what failed; returns the exit code, 1.
int failed(const caf::error& err) {
  std::fprintf(stderr, "ashlar bench gpu: %s\n", describe(err).c_str());
  return 1;
}

// The models to time: those of --hidden, then those of --config. Returns the exit code, 0
// when every one was read.
int models_to_time(const gpu_bench_options& o, std::vector<model_spec>& models) {
  for (const auto& hidden : o.hidden) {
    train_config tc;
    if (auto err = apply_setting(tc, "model.hidden", hidden)) {
      std::fprintf(stderr, "ashlar bench gpu: --hidden %s: %s\n", hidden.c_str(), describe(err).c_str());
      return 2;
    }
    models.push_back(tc.model);
  }
  for (const auto& path : o.configs) {
    train_config tc;
    if (auto err = apply_toml_file(tc, path)) {
      std::fprintf(stderr, "ashlar bench gpu: --config %s: %s\n", path.c_str(), describe(err).c_str());
      return 2;
    }
    models.push_back(tc.model);
  }
  return 0;
}

// A model's training samples/s on the GPU: through the GPU actor (the worker's path), its
// backend called directly, and its local steps on the model the backend keeps.
struct model_rates {
  double gpu = 0;
  double direct = 0;
  double kept = 0;
};

// Times `model`'s steps on batches of `data` through a GPU actor of `pool`, then on the same
// backend called directly and with the model kept on the device. Returns the exit code.
int time_backends(actors::gpu_pool& pool, const model_spec& model, const dataset& data, const gpu_bench_options& o,
                  const gpu::cuda_options& copt, model_rates& rates) {
  // The worker's path: a backend whose calls the device's GPU actor runs.
  auto choice = pool.next_worker()(model);
  if (!choice.backend || std::string{choice.backend->name()} == "cpu") {
    std::fprintf(stderr, "ashlar bench gpu: %s: computing %s\n", model.to_string().c_str(), choice.note.c_str());
    return 1;
  }
  auto gpu_rate = samples_per_second(*choice.backend, data, o);
  choice.backend.reset();
  if (!gpu_rate)
    return failed(gpu_rate.error());
  pool.release(0);
  // The same backend called directly: what the GPU actor's messages cost per step;
  // and its local steps with the model kept on the device.
  auto direct = gpu::make_cuda_backend(model, o.device, copt);
  if (!direct)
    return failed(direct.error());
  auto direct_rate = samples_per_second(**direct, data, o);
  if (!direct_rate)
    return failed(direct_rate.error());
  auto kept_rate = kept_samples_per_second(**direct, data, o);
  direct->reset();
  if (!kept_rate)
    return failed(kept_rate.error());
  rates = model_rates{*gpu_rate, *direct_rate, *kept_rate};
  return 0;
}

// Prints the row of a layered model, its rates alone, and with --json appends them to the file.
void report_layered(const model_spec& model, const gpu_bench_options& o, const model_rates& rates) {
  std::printf("%-22s %6u %13.0f %13.0f %13.0f %8.3f %8s %10s %12s %12s %8s %13s\n", model.to_string().c_str(),
              o.batch, rates.gpu, rates.direct, rates.kept, o.batch / rates.gpu * 1e3, "-", "-", "-", "-", "-",
              "-");
  if (!o.json.empty()) {
    std::ofstream out{o.json, std::ios::app};
    out << "{\"system\": \"ashlar\", \"model\": \"" << model.to_string() << "\", \"batch\": " << o.batch
        << ", \"tf32\": " << (o.tf32 ? "true" : "false") << ", \"samples_per_second\": " << rates.gpu
        << ", \"direct_samples_per_second\": " << rates.direct << ", \"kept_samples_per_second\": " << rates.kept
        << "}\n";
  }
}

// Times what bounds an MLP's step (its transfers' floor, its device compute against cuBLAS's
// on the same products, with --cpu the CPU backend), prints its row and with --json appends
// it to the file. Returns the exit code.
int time_mlp(const mlp_spec& spec, const dataset& data, const gpu_bench_options& o, const gpu::cuda_options& copt,
             const model_rates& rated) {
  // The step's floor: every parameter in and every gradient out (no gradient can
  // leave before the forward pass has all the parameters), at the rates this machine
  // moves the worker's page-locked memory.
  const size_t bytes = spec.num_params() * sizeof(float);
  auto rates = gpu::time_transfers(bytes, o.device, 20);
  if (!rates)
    return failed(rates.error());
  const double floor_s = bytes / (rates->h2d_locked * 1e9) + bytes / (rates->d2h_locked * 1e9);
  const auto shapes = gpu::step_gemms(spec, static_cast<int>(o.batch));
  double flops = 0;
  for (const auto& s : shapes)
    flops += s.flops();
  auto alone = gpu::time_gemms(shapes, o.device, o.tf32, 50);
  if (!alone)
    return failed(alone.error());
  // The step's device compute alone (forward, loss, backward, no transfers): its
  // products' rate against cuBLAS's on the same shapes back to back.
  auto compute = gpu::time_step_compute(spec, o.batch, o.device, copt, 50);
  if (!compute)
    return failed(compute.error());
  const double step_s = o.batch / rated.gpu;
  const double gemm_tflops = flops / *compute * 1e-12, alone_tflops = flops / *alone * 1e-12;
  double cpu_rate = 0;
  if (o.cpu) {
    auto cpu = make_cpu_backend(spec);
    auto r = samples_per_second(*cpu, data, o);
    if (r)
      cpu_rate = *r;
  }
  std::printf("%-22s %6u %13.0f %13.0f %13.0f %8.3f %8.3f %10.3f %12.2f %12.2f %8.2f %13.0f\n",
              spec.to_string().c_str(), o.batch, rated.gpu, rated.direct, rated.kept, step_s * 1e3, floor_s * 1e3,
              *compute * 1e3, gemm_tflops, alone_tflops, gemm_tflops / alone_tflops, cpu_rate);
  std::printf("  %.1f MB of parameters; host to device %.1f GB/s (locked) %.1f (pinned), device to host %.1f "
              "(locked) %.1f (pinned)\n",
              bytes * 1e-6, rates->h2d_locked, rates->h2d_pinned, rates->d2h_locked, rates->d2h_pinned);
  if (!o.json.empty()) {
    std::ofstream out{o.json, std::ios::app};
    out << "{\"system\": \"ashlar\", \"model\": \"" << spec.to_string() << "\", \"batch\": " << o.batch
        << ", \"tf32\": " << (o.tf32 ? "true" : "false") << ", \"samples_per_second\": " << rated.gpu
        << ", \"direct_samples_per_second\": " << rated.direct << ", \"kept_samples_per_second\": " << rated.kept
        << ", \"step_ms\": " << step_s * 1e3
        << ", \"floor_ms\": " << floor_s * 1e3 << ", \"compute_ms\": " << *compute * 1e3
        << ", \"step_tflops\": " << flops / step_s * 1e-12 << ", \"gemm_tflops\": " << gemm_tflops
        << ", \"cublas_alone_tflops\": " << alone_tflops << ", \"h2d_locked_gbps\": " << rates->h2d_locked
        << ", \"d2h_locked_gbps\": " << rates->d2h_locked << ", \"h2d_pinned_gbps\": " << rates->h2d_pinned
        << ", \"d2h_pinned_gbps\": " << rates->d2h_pinned << ", \"cpu_samples_per_second\": " << cpu_rate << "}\n";
    if (!out) {
      std::fprintf(stderr, "ashlar bench gpu: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  return 0;
}

// Times one model on synthetic data and prints its row. Returns the exit code.
int time_model(actors::gpu_pool& pool, const model_spec& model, const gpu_bench_options& o,
               const gpu::cuda_options& copt) {
  auto data = make_synthetic(size_t{o.batch} * 8, static_cast<uint32_t>(model.input.size()), model.classes, 7);
  model_rates rates;
  if (int code = time_backends(pool, model, data, o, copt, rates))
    return code;
  const auto mlp = model.as_mlp();
  if (!mlp) { // a layered model: the rates alone
    report_layered(model, o, rates);
    return 0;
  }
  return time_mlp(*mlp, data, o, copt, rates);
}

}  // namespace

void add_gpu_bench_options(CLI::App* cmd, gpu_bench_options& o) {
  cmd->add_option("--hidden", o.hidden, "hidden widths of each model to time (repeatable)")->capture_default_str();
  cmd->add_option("--config", o.configs, "also time the model of this config file (repeatable; any layers)");
  cmd->add_option("--batch", o.batch, "samples per step")->capture_default_str();
  cmd->add_option("--steps", o.steps, "timed steps per model")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--device", o.device, "CUDA device")->capture_default_str();
  cmd->add_flag("--tf32", o.tf32, "let cuBLAS use TF32 tensor cores");
  cmd->add_flag("--cpu", o.cpu, "also time the CPU backend on each model");
  cmd->add_option("--json", o.json, "append one JSON line per model to FILE");
}

// Times every model of --hidden and --config on the device and prints a row each; returns the exit code.
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
  gpu::cuda_options copt;
  copt.tf32 = o.tf32;
  std::printf("%-22s %6s %13s %13s %13s %8s %8s %10s %12s %12s %8s %13s\n", "model", "batch", "gpu samples/s",
              "direct", "kept", "step ms", "floor ms", "compute ms", "gemm TFLOP/s", "cuBLAS alone", "fraction",
              "cpu samples/s");
  std::vector<model_spec> models;
  if (int code = models_to_time(o, models))
    return code;
  for (const auto& model : models)
    if (int code = time_model(**pool, model, o, copt))
      return code;
  return 0;
}

}  // namespace ashlar::cli
