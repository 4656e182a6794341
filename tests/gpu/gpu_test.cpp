// The CUDA backend and the GPU actors. Cases that need a device print "SKIPPED: no CUDA
// device: <why>" and return when there is none; ctest reports them as skipped (see
// tests/CMakeLists.txt). The cases without that line run everywhere.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <limits>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/gpu_actor.hpp"
#include "actors/local_job.hpp"
#include "actors/interfaces.hpp"
#include "gpu/bench_timers.hpp"
#include "gpu/cuda_backend.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/backend/held_model.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/data/dataset.hpp"

using namespace ashlar;

namespace {

std::optional<std::string> why_no_gpu() {
  auto d = gpu::list_devices();
  if (d)
    return std::nullopt;
  return describe(d.error());
}

#define REQUIRE_GPU_OR_SKIP()                                                                                   \
  do {                                                                                                          \
    if (auto why_ = why_no_gpu()) {                                                                             \
      std::printf("SKIPPED: no CUDA device: %s\n", why_->c_str());                                             \
      SUCCEED("no CUDA device");                                                                                \
      return;                                                                                                   \
    }                                                                                                           \
  } while (false)

// On a GPU machine without this one's packages, ops/gpu.sh points these elsewhere.
std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

const std::string data_dir = env_or("ASHLAR_DATA_DIR", "/usr/share/datasets/fashion-mnist");

const dataset& fmnist() {
  static dataset d = [] {
    auto t = load_fashion_mnist(data_dir, split::train);
    REQUIRE(t);
    t->expand(); // the tests take views of the whole set
    return std::move(*t);
  }();
  return d;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

// The CPU and GPU gradients of `spec` on `n` Fashion-MNIST samples from `offset`.
double compare(const mlp_spec& spec, size_t offset, size_t n, bool tf32) {
  const auto& d = fmnist();
  batch_view b{d.x.data() + offset * d.dim, d.y.data() + offset, n, d.dim};
  auto params = init_params(spec, 17 + n);
  auto cpu = make_cpu_backend(spec);
  gpu::cuda_options o;
  o.tf32 = tf32;
  auto cuda = gpu::make_cuda_backend(spec, 0, o);
  REQUIRE(cuda);
  std::vector<float> g_cpu(spec.num_params()), g_gpu(spec.num_params(), std::nanf(""));
  auto s_cpu = cpu->train_step(params.data(), b, g_cpu.data());
  auto s_gpu = (*cuda)->train_step(params.data(), b, g_gpu.data());
  REQUIRE(s_cpu);
  REQUIRE(s_gpu);
  for (float g : g_gpu)
    REQUIRE(std::isfinite(g)); // every entry written
  CHECK(s_gpu->n == n);
  CHECK(std::abs(s_gpu->loss_sum - s_cpu->loss_sum) / s_cpu->loss_sum < (tf32 ? 1e-2 : 1e-4));
  CHECK(static_cast<double>(s_gpu->correct) == Approx(static_cast<double>(s_cpu->correct)).margin(tf32 ? 3 : 1));
  auto e_cpu = cpu->evaluate(params.data(), b), e_gpu = (*cuda)->evaluate(params.data(), b);
  REQUIRE(e_gpu);
  CHECK(std::abs(e_gpu->loss_sum - e_cpu->loss_sum) / e_cpu->loss_sum < (tf32 ? 1e-2 : 1e-4));
  const double err = rel_error(g_gpu, g_cpu);
  std::printf("%s batch %zu%s: gradient relative error %.2e\n", spec.to_string().c_str(), n, tf32 ? " tf32" : "",
              err);
  return err;
}

// A quiet in-process job on part of Fashion-MNIST: `workers` CPU workers, 2 shards.
train_config small_job(uint64_t train, uint64_t test, uint32_t workers, uint32_t epochs) {
  train_config cfg;
  cfg.data_dir = data_dir;
  cfg.train_limit = train;
  cfg.test_limit = test;
  cfg.workers = workers;
  cfg.servers = 2;
  cfg.epochs = epochs;
  cfg.progress_interval = 0;
  cfg.eval_every_epoch = false;
  cfg.log_level = "warn";
  cfg.gpus = "none";
  return cfg;
}

// The model of a shipped config file.
model_spec config_model(const std::string& name) {
  train_config tc;
  const auto path = env_or("ASHLAR_TEST_SOURCE", ASHLAR_SOURCE_DIR) + "/ops/configs/" + name;
  auto err = apply_toml_file(tc, path);
  INFO(path << ": " << describe(err));
  REQUIRE(!err);
  return tc.model;
}

// The CPU and GPU gradients of a layered model on `n` Fashion-MNIST samples from
// `offset`, both backends drawing the same dropout masks (seed 99): over `steps` steps on
// the same batch (the masks change from step to step), the largest relative error.
// The CPU computes its convolutions by im2col, as the GPU does: a max pool's winner
// among near-equal inputs follows the convolution's rounding, so oneDNN's convolutions
// route a few gradients elsewhere (on the CNN at batch 64, oneDNN's gradient and
// im2col's, both on the CPU, differ by 1.4e-4).
double compare_model(const model_spec& spec, size_t offset, size_t n, int steps = 2) {
  const auto& d = fmnist();
  batch_view b{d.x.data() + offset * d.dim, d.y.data() + offset, n, d.dim};
  auto params = init_params(spec, 23 + n);
  auto cpu = make_cpu_backend(spec, cpu_conv::im2col, 99);
  REQUIRE(cpu);
  gpu::cuda_options o;
  o.seed = 99;
  auto cuda = gpu::make_cuda_backend(spec, 0, o);
  REQUIRE(cuda);
  CHECK(std::string{(*cuda)->name()} == "cuda:0");
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> g_cpu(spec.num_params()), g_gpu(spec.num_params(), std::nanf(""));
    auto s_cpu = (*cpu)->train_step(params.data(), b, g_cpu.data());
    auto s_gpu = (*cuda)->train_step(params.data(), b, g_gpu.data());
    REQUIRE(s_cpu);
    REQUIRE(s_gpu);
    for (float g : g_gpu)
      REQUIRE(std::isfinite(g)); // every entry written
    CHECK(s_gpu->n == n);
    CHECK(std::abs(s_gpu->loss_sum - s_cpu->loss_sum) / s_cpu->loss_sum < 1e-4);
    CHECK(static_cast<double>(s_gpu->correct) == Approx(static_cast<double>(s_cpu->correct)).margin(1));
    worst = std::max(worst, rel_error(g_gpu, g_cpu));
  }
  auto e_cpu = (*cpu)->evaluate(params.data(), b), e_gpu = (*cuda)->evaluate(params.data(), b);
  REQUIRE(e_cpu);
  REQUIRE(e_gpu);
  CHECK(std::abs(e_gpu->loss_sum - e_cpu->loss_sum) / e_cpu->loss_sum < 1e-4);
  std::printf("%s batch %zu: gradient relative error %.2e\n", spec.to_string().c_str(), n, worst);
  return worst;
}

}  // namespace

TEST_CASE("the CUDA backend's gradients match the CPU backend's on the CNN, the residual network and a model "
          "with every layer kind (FP32 relative error < 1e-4, dropout masks alike)") {
  REQUIRE_GPU_OR_SKIP();
  const auto cnn = config_model("fmnist-cnn.toml");
  for (size_t n : {1u, 64u, 300u})
    CHECK(compare_model(cnn, 11 * n, n) < 1e-4);
  CHECK(compare_model(config_model("fmnist-resnet.toml"), 7, 48) < 1e-4);
  // Strided and padded convolutions, overlapping and padded pools, group and layer
  // norm, a residual add whose operand is read twice, dropout.
  model_spec every;
  every.input = {1, 28, 28};
  every.classes = 10;
  auto layers = parse_layers("conv2d name=c1 out=6 kernel=3 stride=2 padding=1; groupnorm groups=2; relu;"
                             "maxpool name=pool1 kernel=3 stride=2 padding=1; conv2d out=6 kernel=3 padding=1;"
                             "layernorm; add from=pool1; relu; avgpool kernel=2 padding=1; flatten; dropout p=0.3;"
                             "dense out=24; relu; dense out=10");
  REQUIRE(layers);
  every.layers = *layers;
  for (size_t n : {1u, 33u, 200u})
    CHECK(compare_model(every, 3 * n, n, 3) < 1e-4);
}

TEST_CASE("the CUDA backends keep a local model as the host reference does: local steps with momentum, a commit "
          "taken, an overlapped pull rebased, a velocity fetched, a non-finite loss dropping the velocity") {
  REQUIRE_GPU_OR_SKIP();
  const auto& d = fmnist();
  mlp_spec mlp;
  mlp.hidden = {256, 128};
  for (const auto& spec : {from_mlp(mlp), config_model("fmnist-cnn.toml")}) {
    INFO(spec.to_string());
    auto cpu = make_cpu_backend(spec, cpu_conv::im2col, 99);
    REQUIRE(cpu);
    auto host = hold_local_model(std::move(*cpu));
    gpu::cuda_options o;
    o.seed = 99;
    auto cuda = gpu::make_cuda_backend(spec, 0, o);
    REQUIRE(cuda);
    auto& dev = **cuda;
    REQUIRE(dev.keeps_local_model());
    const size_t n = spec.num_params();
    auto params = init_params(spec, 5);
    std::vector<float> velocity(n, 0.01f), commit(n, 0.02f), pulled = init_params(spec, 6);
    auto batch = [&](size_t k) { return batch_view{d.x.data() + 64 * k * d.dim, d.y.data() + 64 * k, 64, d.dim}; };
    auto both = [&](auto&& call) {
      auto a = call(*host);
      auto b = call(dev);
      return std::pair{a, b};
    };
    std::vector<float> out_host(n), out_dev(n), v_host(n), v_dev(n);
    // A load with a velocity and an open commit, then local steps.
    for (size_t k = 0; k < 4; ++k) {
      auto [a, b] = both([&](compute_backend& be) {
        return be.local_step(k == 0 ? params.data() : nullptr, k == 0 ? velocity.data() : nullptr,
                             k == 0 ? commit.data() : nullptr, batch(k), 0.05f, 0.5f);
      });
      REQUIRE(a);
      REQUIRE(b);
      CHECK(b->loss_sum == Approx(a->loss_sum).epsilon(1e-4));
    }
    REQUIRE_FALSE(host->take_commit(out_host.data(), 0.5f, v_host.data()));
    REQUIRE_FALSE(dev.take_commit(out_dev.data(), 0.5f, v_dev.data()));
    CHECK(rel_error(out_dev, out_host) < 1e-4);
    CHECK(rel_error(v_dev, v_host) < 1e-4);
    // Two steps behind the commit, then its pull lands: the model is the pulled one less them.
    for (size_t k = 4; k < 6; ++k) {
      auto [a, b] = both([&](compute_backend& be) { return be.local_step(nullptr, nullptr, nullptr, batch(k), 0.05f, 0.5f); });
      REQUIRE(a);
      REQUIRE(b);
    }
    REQUIRE_FALSE(host->rebase(pulled.data(), 0.05f));
    REQUIRE_FALSE(dev.rebase(pulled.data(), 0.05f));
    auto [a, b] = both([&](compute_backend& be) { return be.local_step(nullptr, nullptr, nullptr, batch(6), 0.05f, 0.5f); });
    REQUIRE(a);
    REQUIRE(b);
    CHECK(b->loss_sum == Approx(a->loss_sum).epsilon(1e-4)); // the same rebased model
    REQUIRE_FALSE(host->take_commit(out_host.data(), 1.0f, nullptr));
    REQUIRE_FALSE(dev.take_commit(out_dev.data(), 1.0f, nullptr));
    CHECK(rel_error(out_dev, out_host) < 1e-4);
    // The velocity alone: the open commit stays.
    REQUIRE_FALSE(dev.take_commit(nullptr, 1.0f, v_dev.data()));
    REQUIRE_FALSE(host->take_commit(nullptr, 1.0f, v_host.data()));
    CHECK(rel_error(v_dev, v_host) < 1e-4);
    // A model that gives a loss that is not finite: numerical_error, the velocity dropped.
    std::vector<float> broken(n, std::numeric_limits<float>::infinity());
    auto bad = dev.local_step(broken.data(), nullptr, nullptr, batch(7), 0.05f, 0.5f);
    REQUIRE_FALSE(bad);
    CHECK(is(bad.error(), errc::numerical_error));
    REQUIRE_FALSE(dev.take_commit(nullptr, 1.0f, v_dev.data()));
    CHECK(std::all_of(v_dev.begin(), v_dev.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("the CUDA backend refuses a model with an external layer, naming it, and a layered model's bad batch") {
  REQUIRE_GPU_OR_SKIP();
  model_spec ext;
  ext.input = {784, 1, 1};
  auto layers = parse_layers("external name=host params=100 out=10");
  REQUIRE(layers);
  ext.layers = *layers;
  auto b = gpu::make_cuda_backend(ext, 0);
  REQUIRE_FALSE(b);
  CHECK(describe(b.error()).find("'host' is an external layer") != std::string::npos);
  const auto cnn = config_model("fmnist-cnn.toml");
  auto cuda = gpu::make_cuda_backend(cnn, 0);
  REQUIRE(cuda);
  std::vector<float> x(100, 0.0f), params = init_params(cnn, 1), grad(params.size());
  std::vector<uint8_t> y(1, 3);
  auto s = (*cuda)->train_step(params.data(), batch_view{x.data(), y.data(), 1, 100}, grad.data());
  REQUIRE_FALSE(s);
  CHECK(describe(s.error()).find("expects 784 (1x28x28)") != std::string::npos);
}

TEST_CASE("the CUDA backend's gradients match the CPU backend's on the same batches (FP32 relative error < 1e-4)") {
  REQUIRE_GPU_OR_SKIP();
  mlp_spec mlp;
  mlp.input = 784;
  mlp.hidden = {256, 128};
  mlp.classes = 10;
  for (size_t n : {1u, 64u, 1000u})
    CHECK(compare(mlp, 37 * n, n, false) < 1e-4);
  mlp_spec wide = mlp;
  wide.hidden = {1024, 1024};
  CHECK(compare(wide, 5, 333, false) < 1e-4);
  // TF32 tensor cores trade precision for speed: about 1e-3.
  CHECK(compare(mlp, 0, 256, true) < 1e-2);
}

TEST_CASE("page-locked parameter and gradient buffers go to and from the device directly and give the same "
          "gradients as pageable ones, and a large evaluation runs in parts") {
  REQUIRE_GPU_OR_SKIP();
  mlp_spec spec;
  spec.input = 784;
  spec.hidden = {512, 256};
  spec.classes = 10;
  auto cuda = gpu::make_cuda_backend(spec, 0);
  REQUIRE(cuda);
  const auto& d = fmnist();
  batch_view b{d.x.data() + 500 * d.dim, d.y.data() + 500, 200, d.dim};
  auto params = init_params(spec, 5);
  std::vector<float> g_pageable(spec.num_params(), std::nanf(""));
  auto s1 = (*cuda)->train_step(params.data(), b, g_pageable.data());
  REQUIRE(s1);
  auto locked_params = params;
  std::vector<float> g_locked(spec.num_params(), std::nanf(""));
  auto lock_p = (*cuda)->lock_host_memory(locked_params.data(), locked_params.size() * sizeof(float));
  auto lock_g = (*cuda)->lock_host_memory(g_locked.data(), g_locked.size() * sizeof(float));
  CHECK(lock_p != nullptr); // a GPU machine can lock host memory
  CHECK(lock_g != nullptr);
  auto s2 = (*cuda)->train_step(locked_params.data(), b, g_locked.data());
  REQUIRE(s2);
  for (size_t i = 0; i < g_locked.size(); ++i)
    REQUIRE(std::isfinite(g_locked[i])); // every layer's range came back
  CHECK(std::abs(s2->loss_sum - s1->loss_sum) < 1e-9 * s1->loss_sum); // summed by atomics: order varies
  CHECK(rel_error(g_locked, g_pageable) < 1e-6);
  auto cpu = make_cpu_backend(spec);
  std::vector<float> g_cpu(spec.num_params());
  REQUIRE(cpu->train_step(params.data(), b, g_cpu.data()));
  CHECK(rel_error(g_locked, g_cpu) < 1e-4);
  // Small pieces: every layer split into uneven pieces of output units (the last layer's
  // 10 rows in 784-float pieces of 3 rows, 3, 3 and 1), each moved and computed alone.
  for (size_t piece : {784u, 5000u, 100000u}) {
    gpu::cuda_options o;
    o.piece_floats = piece;
    auto pieced = gpu::make_cuda_backend(spec, 0, o);
    REQUIRE(pieced);
    std::vector<float> g(spec.num_params(), std::nanf(""));
    REQUIRE((*pieced)->train_step(locked_params.data(), b, g.data()));
    for (size_t i = 0; i < g.size(); ++i)
      REQUIRE(std::isfinite(g[i]));
    const double err = rel_error(g, g_cpu);
    std::printf("pieces of %zu floats: gradient relative error %.2e\n", piece, err);
    CHECK(err < 1e-4);
    auto e = (*pieced)->evaluate(locked_params.data(), b);
    REQUIRE(e);
    CHECK(std::abs(e->loss_sum - s1->loss_sum) < 1e-4 * s1->loss_sum);
  }
  // 20000 samples: three parts of at most 8192 on the device.
  batch_view all{d.x.data(), d.y.data(), 20000, d.dim};
  auto e_gpu = (*cuda)->evaluate(locked_params.data(), all);
  auto e_cpu = cpu->evaluate(params.data(), all);
  REQUIRE(e_gpu);
  REQUIRE(e_cpu);
  CHECK(e_gpu->n == 20000);
  CHECK(std::abs(e_gpu->loss_sum - e_cpu->loss_sum) / e_cpu->loss_sum < 1e-4);
  CHECK(static_cast<double>(e_gpu->correct) == Approx(static_cast<double>(e_cpu->correct)).margin(3));
}

TEST_CASE("the CUDA backend refuses a batch of the wrong width or with a bad label, naming it") {
  REQUIRE_GPU_OR_SKIP();
  mlp_spec spec;
  spec.input = 784;
  spec.hidden = {32};
  spec.classes = 10;
  auto cuda = gpu::make_cuda_backend(spec, 0);
  REQUIRE(cuda);
  auto params = init_params(spec, 1);
  std::vector<float> x(10 * 783, 0.5f), g(spec.num_params());
  std::vector<uint8_t> y(10, 3);
  auto r = (*cuda)->train_step(params.data(), {x.data(), y.data(), 10, 783}, g.data());
  REQUIRE_FALSE(r);
  CHECK(describe(r.error()).find("783") != std::string::npos);
  std::vector<float> x2(2 * 784, 0.5f);
  std::vector<uint8_t> y2{3, 12};
  r = (*cuda)->train_step(params.data(), {x2.data(), y2.data(), 2, 784}, g.data());
  REQUIRE_FALSE(r);
  CHECK(describe(r.error()).find("label 12") != std::string::npos);
  auto missing = gpu::make_cuda_backend(spec, 64);
  REQUIRE_FALSE(missing);
  CHECK(describe(missing.error()).find("GPU 64 does not exist") != std::string::npos);
}

TEST_CASE("without a usable GPU, asking for one fails with a device_error that says why") {
#ifdef ASHLAR_CUDA_MODULE_PATH
  // The module is opened even on a host without the NVIDIA driver (its absence would
  // otherwise answer before CUDA is asked): the loader and CUDA's own answer are checked.
  ::setenv("ASHLAR_CUDA_MODULE", ASHLAR_CUDA_MODULE_PATH, 1);
#endif
  auto devices = gpu::list_devices();
  if (devices) {
    std::printf("this machine has %zu CUDA device(s); the no-GPU path is checked where there are none\n",
                devices->size());
    CHECK_FALSE(devices->empty());
    return;
  }
  const auto why = describe(devices.error());
  INFO(why);
  CHECK(why.find("device_error") != std::string::npos);
  if (gpu::built_with_cuda())
    CHECK(why.find("cudaGetDeviceCount") != std::string::npos); // the failed call, by name
  else
    CHECK(why.find("no CUDA backend") != std::string::npos);
  mlp_spec spec;
  spec.input = 4;
  spec.hidden = {4};
  spec.classes = 2;
  auto b = gpu::make_cuda_backend(spec, 0);
  REQUIRE_FALSE(b);
  CHECK(describe(b.error()) == why);
  // Host memory is not locked without a device; callers' transfers need no lock.
  std::vector<float> buf(1024);
  CHECK(gpu::lock_host(buf.data(), buf.size() * sizeof(float)) == nullptr);
}

// ---- GPU actors and the worker's choice of device ----

namespace {

struct system_config : caf::actor_system_config {
  system_config() {
    actors::register_types(*this);
  }
};

}  // namespace

TEST_CASE("a GPU pool without GPUs gives every worker the CPU and says why, and a GPU list is checked") {
  system_config cfg;
  caf::actor_system sys{cfg};
  model_spec spec;
  spec.hidden = {64};
  auto none = actors::gpu_pool::start(sys, "none", false);
  REQUIRE(none);
  CHECK((*none)->labels().empty());
  auto c = (*none)->next_worker()(spec);
  CHECK(std::string{c.backend->name()} == "cpu");
  CHECK(c.note == "on the CPU: no GPU: --gpus none");
  auto unasked = actors::gpu_pool::start(sys, "", false);
  REQUIRE(unasked);
  CHECK((*unasked)->next_worker()(spec).note == "on the CPU: no GPU asked for (--gpus auto uses the GPUs there are)");
  CHECK(c.quiet);
  auto bad = actors::gpu_pool::start(sys, "0,x", false);
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("not 'x'") != std::string::npos);
  auto absent = actors::gpu_pool::start(sys, "64", false);
  REQUIRE_FALSE(absent);
  CHECK(describe(absent.error()).find("--gpus 64") != std::string::npos);
  auto devices = gpu::list_devices();
  if (!devices) {
    // "auto" on a machine without a GPU is no error: every worker computes on the CPU.
    auto pool = actors::gpu_pool::start(sys, "auto", false);
    REQUIRE(pool);
    CHECK((*pool)->labels().empty());
    auto w = (*pool)->next_worker()(spec);
    CHECK(std::string{w.backend->name()} == "cpu");
    CHECK(w.note == "on the CPU: no GPU found"); // why CUDA found none is a debug line
    CHECK(w.quiet);                             // not a line per worker
  }
}

TEST_CASE("GPU actors (emulated by CPU backends) serve their workers' steps through blocking calls, hand out one "
          "device per worker, and pass errors back") {
  system_config cfg;
  caf::actor_system sys{cfg};
  model_spec spec;
  spec.hidden = {64, 32};
  auto pool = actors::gpu_pool::start_emulated(sys, 2, [](const model_spec& s) -> expected<std::unique_ptr<compute_backend>> {
    if (s.hidden.size() == 1 && s.hidden[0] == 7)
      return make_error(errc::device_error, "out of device memory (emulated)");
    return make_cpu_backend(s);
  });
  REQUIRE(pool->labels() == std::vector<std::string>{"emulated:0", "emulated:1"});
  uint32_t slot_a = 9, slot_b = 9, slot_c = 9;
  auto a = pool->next_worker(&slot_a)(spec);
  auto b = pool->next_worker(&slot_b)(spec);
  auto c = pool->next_worker(&slot_c)(spec);
  CHECK(slot_a == 0);
  CHECK(slot_b == 1);
  CHECK(slot_c == UINT32_MAX);
  CHECK(a.note == "on cpu (emulated)");
  CHECK(c.note == "on the CPU: every GPU of this process (2) is taken by another worker");
  // The step through the actor is the device backend's step, bit for bit.
  const auto& d = fmnist();
  batch_view batch{d.x.data() + 640 * d.dim, d.y.data() + 640, 64, d.dim};
  auto params = init_params(spec, 9);
  std::vector<float> g_actor(spec.num_params()), g_direct(spec.num_params());
  auto s_actor = a.backend->train_step(params.data(), batch, g_actor.data());
  auto s_direct = c.backend->train_step(params.data(), batch, g_direct.data());
  REQUIRE(s_actor);
  REQUIRE(s_direct);
  CHECK(g_actor == g_direct);
  CHECK(s_actor->loss_sum == s_direct->loss_sum);
  auto e = b.backend->evaluate(params.data(), batch);
  REQUIRE(e);
  CHECK(e->n == 64);
  // A step the device refuses comes back as the device's error.
  batch_view narrow{d.x.data(), d.y.data(), 4, 783};
  auto bad = a.backend->train_step(params.data(), narrow, g_actor.data());
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("783") != std::string::npos);
  // A device that cannot take the model leaves the worker on the CPU, saying why.
  pool->release(slot_a);
  model_spec odd = spec;
  odd.hidden = {7};
  auto fallback = pool->next_worker()(odd);
  CHECK(std::string{fallback.backend->name()} == "cpu");
  CHECK(fallback.note == "on the CPU: emulated:0 could not take the model: device_error: out of device memory "
                         "(emulated)");
}

TEST_CASE("a BSP job whose workers compute through (emulated) GPU actors gives the same parameters, bit for bit, "
          "as one on the CPU") {
  auto cfg = small_job(4000, 1000, 3, 1);
  cfg.batch_size = 32;
  std::vector<float> cpu, through_actors;
  REQUIRE(actors::run_local_job(cfg, {}, &cpu));
  actors::job_hooks hooks;
  std::shared_ptr<actors::gpu_pool> pool;
  hooks.gpus = [&](caf::actor_system& sys) {
    // Two devices for three workers: two go through GPU actors, one stays on the CPU.
    pool = actors::gpu_pool::start_emulated(sys, 2, [](const model_spec& s) -> expected<std::unique_ptr<compute_backend>> {
      return make_cpu_backend(s);
    });
    return pool;
  };
  REQUIRE(actors::run_local_job(cfg, hooks, &through_actors));
  REQUIRE(pool);
  REQUIRE(cpu.size() == through_actors.size());
  CHECK(cpu == through_actors);
}

namespace {

// Counts the calls that reach a backend (through a GPU actor).
struct call_counts {
  std::atomic<int> train{0}, local{0}, loads{0}, commits{0}, rebases{0};
};

class counting_backend final : public compute_backend {
public:
  counting_backend(std::unique_ptr<compute_backend> inner, call_counts& n) : inner_(std::move(inner)), n_(n) {}
  const char* name() const override { return inner_->name(); }
  const model_spec& spec() const override { return inner_->spec(); }
  expected<batch_stats> train_step(const float* p, batch_view b, float* g) override {
    ++n_.train;
    return inner_->train_step(p, b, g);
  }
  expected<batch_stats> evaluate(const float* p, batch_view b) override { return inner_->evaluate(p, b); }
  bool keeps_local_model() const override { return inner_->keeps_local_model(); }
  expected<batch_stats> local_step(const float* load, const float* v, const float* c, batch_view b, float lr,
                                   float m) override {
    ++n_.local;
    n_.loads += load != nullptr;
    return inner_->local_step(load, v, c, b, lr, m);
  }
  caf::error take_commit(float* out, float scale, float* v) override {
    ++n_.commits;
    return inner_->take_commit(out, scale, v);
  }
  caf::error rebase(const float* pulled, float lr) override {
    ++n_.rebases;
    return inner_->rebase(pulled, lr);
  }

private:
  std::unique_ptr<compute_backend> inner_;
  call_counts& n_;
};

}  // namespace

TEST_CASE("a worker whose (emulated) GPU actor keeps its local model trains adsp and ashl jobs there: local steps "
          "on the device, the model sent only after pulls, commits taken from it, and both it and a worker "
          "whose device keeps nothing train") {
  auto cfg = small_job(16000, 2000, 1, 3);
  for (const char* policy : {"adsp", "ashl"}) {
    INFO(policy);
    REQUIRE_FALSE(apply_setting(cfg, "train.policy", policy));
    for (bool overlap : {false, true}) {
      INFO("overlapped commits: " << overlap);
      auto c = cfg;
      c.overlap_commits = overlap;
      double accuracy[2] = {0, 0};
      for (bool keep : {false, true}) {
        call_counts n;
        actors::job_hooks hooks;
        std::shared_ptr<actors::gpu_pool> pool;
        hooks.gpus = [&](caf::actor_system& sys) {
          pool = actors::gpu_pool::start_emulated(
            sys, 1,
            [&n](const model_spec& s) -> expected<std::unique_ptr<compute_backend>> {
              auto b = make_cpu_backend(s);
              if (!b)
                return b.error();
              return std::unique_ptr<compute_backend>{
                std::make_unique<counting_backend>(hold_local_model(std::move(*b)), n)};
            },
            keep);
          return pool;
        };
        auto report = actors::run_local_job(c, hooks);
        REQUIRE(report);
        accuracy[keep] = report->test_accuracy;
        std::printf("%s%s, model %s: accuracy %.4f; device calls: %d training steps, %d local steps (%d with the "
                    "model sent), %d commits taken, %d rebases\n",
                    policy, overlap ? " (overlapped commits)" : "", keep ? "kept by the device" : "sent every step",
                    report->test_accuracy, n.train.load(), n.local.load(), n.loads.load(), n.commits.load(),
                    n.rebases.load());
        if (!keep) {
          CHECK(n.local == 0); // the pool told the worker its device keeps nothing
          continue;
        }
        CHECK(n.local > 0);
        CHECK(n.commits > 0);
        CHECK(n.loads < n.local); // not every local step carries the model
        CHECK((n.rebases > 0) == overlap);
      }
      // Both train: far above chance (0.1) after 3 epochs of one worker. The runs' commit
      // plans follow measured times, so their accuracies differ by several points from run
      // to run, either way: on an H100 machine 0.85 and 0.78 once, 0.79 and 0.84 another
      // time; on 2 cores, ashl with overlapped commits (1-3 local steps each) ends
      // anywhere from 0.71 to 0.84 over 12 runs, the model sent or kept alike, so the bound
      // leaves room below that. The step machine's test shows the
      // arithmetic of the two paths equal, bit for bit.
      CHECK(accuracy[0] > 0.6);
      CHECK(accuracy[1] > 0.6);
    }
  }
}

TEST_CASE("a GPU pool gives each worker one GPU actor's device while there are some, then the CPU") {
  REQUIRE_GPU_OR_SKIP();
  system_config cfg;
  caf::actor_system sys{cfg};
  model_spec spec;
  spec.hidden = {64};
  auto devices = gpu::list_devices();
  auto pool = actors::gpu_pool::start(sys, "auto", false);
  REQUIRE(pool);
  REQUIRE((*pool)->labels().size() == devices->size());
  std::vector<actors::backend_choice> taken;
  for (size_t i = 0; i < devices->size(); ++i) {
    taken.push_back((*pool)->next_worker()(spec));
    CHECK(std::string{taken.back().backend->name()}.rfind("cuda:" + std::to_string(i), 0) == 0);
    CHECK(taken.back().note.rfind("on cuda:" + std::to_string(i) + " (", 0) == 0);
  }
  auto extra = (*pool)->next_worker()(spec);
  CHECK(std::string{extra.backend->name()} == "cpu");
  CHECK(extra.note.find("is taken by another worker") != std::string::npos);
  // Through the GPU actor, the device computes what the CPU does.
  const auto& d = fmnist();
  batch_view b{d.x.data(), d.y.data(), 128, d.dim};
  auto params = init_params(spec, 3);
  std::vector<float> g_gpu(spec.num_params()), g_cpu(spec.num_params());
  auto s_gpu = taken[0].backend->train_step(params.data(), b, g_gpu.data());
  auto s_cpu = extra.backend->train_step(params.data(), b, g_cpu.data());
  REQUIRE(s_gpu);
  REQUIRE(s_cpu);
  CHECK(rel_error(g_gpu, g_cpu) < 1e-4);
}

// ---- a mixed cluster ----

namespace {

// Runs `ashlar train CONFIG ARGS` (config under ops/configs), its output into `log`;
// returns the exit status and the output.
std::pair<int, std::string> train(const std::string& config, const std::string& args, const std::string& log) {
  const std::string cmd = env_or("ASHLAR_TEST_BINARY", ASHLAR_BINARY) + " train "
                          + env_or("ASHLAR_TEST_SOURCE", ASHLAR_SOURCE_DIR) + "/ops/configs/" + config + " " + args
                          + " --set run.progress_interval=0 --data-dir " + data_dir + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::string out;
  std::FILE* f = std::fopen(log.c_str(), "r");
  if (f) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0)
      out.append(buf, n);
    std::fclose(f);
  }
  return {rc, out};
}

// The final evaluation's accuracy: "test accuracy A (loss L) on 10000 samples after ...".
double final_accuracy(const std::string& out) {
  const auto at = out.rfind("test accuracy 0.");
  REQUIRE(at != std::string::npos);
  REQUIRE(out.find(" on 10000 samples", at) != std::string::npos);
  return std::stod(out.substr(at + 14));
}

// "batch shares from profiled speed: 0:S0 [...), 1:S1 [...), 2:S2 [...)"
std::vector<unsigned> profiled_shares(const std::string& out) {
  const auto at = out.find("batch shares from profiled speed: ");
  REQUIRE(at != std::string::npos);
  unsigned s0 = 0, s1 = 0, s2 = 0;
  REQUIRE(std::sscanf(out.c_str() + at + 34, "0:%u [%*u, %*u), 1:%u [%*u, %*u), 2:%u", &s0, &s1, &s2) == 3);
  return {s0, s1, s2};
}

}  // namespace

TEST_CASE("a mixed cluster (one GPU worker, two CPU workers) trains Fashion-MNIST to 85% with the GPU worker "
          "given the largest batch share") {
  REQUIRE_GPU_OR_SKIP();
  auto [rc, out] = train("fmnist-mlp.toml", "--workers 3 --gpus 0 --policy bsp --epochs 4"
                                            " --set train.allocation=proportional", "gpu-mixed.log");
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("worker 0: computing on cuda:0") != std::string::npos);
  CHECK(out.find("worker 1: computing on the CPU") != std::string::npos);
  const auto s = profiled_shares(out);
  std::printf("mixed cluster shares: GPU worker %u, CPU workers %u and %u\n", s[0], s[1], s[2]);
  CHECK(s[0] > s[1]);
  CHECK(s[0] > s[2]);
  CHECK(final_accuracy(out) >= 0.85);
}

TEST_CASE("the CNN config trains with a GPU worker beside CPU workers: under BSP with the GPU worker given the "
          "largest share, and under ashl's local steps") {
  REQUIRE_GPU_OR_SKIP();
  {
    auto [rc, out] = train("fmnist-cnn.toml", "--workers 3 --gpus 0 --policy bsp --epochs 2"
                                              " --set train.allocation=proportional", "gpu-cnn-bsp.log");
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("worker 0: computing on cuda:0") != std::string::npos);
    const auto s = profiled_shares(out);
    const double acc = final_accuracy(out);
    std::printf("CNN, bsp: shares GPU worker %u, CPU workers %u and %u; test accuracy %.4f\n", s[0], s[1], s[2],
                acc);
    CHECK(s[0] > s[1]);
    CHECK(s[0] > s[2]);
    CHECK(acc >= 0.85);
  }
  {
    auto [rc, out] = train("fmnist-cnn.toml", "--workers 3 --gpus 0 --policy ashl --epochs 3", "gpu-cnn-ashl.log");
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("worker 0: computing on cuda:0") != std::string::npos);
    const double acc = final_accuracy(out);
    std::printf("CNN, ashl: test accuracy %.4f\n", acc);
    CHECK(acc >= 0.85);
  }
}
