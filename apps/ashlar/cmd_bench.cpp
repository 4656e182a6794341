// `ashlar bench step`: the CPU backend's training step time (forward, backward and the
// SGD update) per sample, for comparison with other frameworks on the same MLP.
#include <chrono>
#include <deque>
#include <cstdio>

#include <caf/io/all.hpp>
#include <csignal>
#include <fstream>
#include <thread>

#include "actors/cluster/data_plane.hpp"
#include "actors/cluster/system.hpp"
#include "actors/server_shard.hpp"
#include "apps/ashlar/bench_gpu.hpp"
#include "apps/ashlar/bench_hetero.hpp"
#include "apps/ashlar/bench_transport.hpp"
#include "apps/ashlar/commands.hpp"
#include "apps/ashlar/security_options.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/core/log.hpp"
#include "runtime/os/subprocess.hpp"
#include "runtime/backend/cpu_backend.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/optim/sgd.hpp"

namespace ashlar::cli {

namespace {

struct bench_options {
  uint32_t batch = 64;
  std::string hidden = "256,128";
  std::string config;
  uint32_t steps = 300;
  uint32_t warmup = 30;
  int threads = 1;
  std::string conv = "measure";
  bool json = false;
};

int run_step_bench(const bench_options& o) {
  train_config cfg;
  if (auto err = o.config.empty() ? apply_setting(cfg, "model.hidden", o.hidden) : apply_toml_file(cfg, o.config)) {
    std::fprintf(stderr, "ashlar bench: %s\n", describe(err).c_str());
    return 2;
  }
  if (o.batch == 0 || o.steps == 0) {
    std::fprintf(stderr, "ashlar bench: --batch and --steps must be at least 1\n");
    return 2;
  }
  set_blas_threads(o.threads);
  const auto& spec = cfg.model;
  auto data = make_synthetic(size_t{o.batch} * 16, spec.input.size(), spec.classes, 7);
  data.shape = spec.input;
  auto params = init_params(spec, 1);
  std::vector<float> grad(params.size()), velocity(params.size());
  sgd_config opt;
  opt.lr = 0.01f;
  const auto conv = o.conv == "im2col" ? cpu_conv::im2col : o.conv == "onednn" ? cpu_conv::onednn : cpu_conv::measure;
  auto made = make_cpu_backend(spec, conv);
  if (!made) {
    std::fprintf(stderr, "ashlar bench: %s\n", describe(made.error()).c_str());
    return 2;
  }
  auto backend = std::move(*made);
  batch_cursor cursor{data, 0, data.n, 3};
  auto step = [&] {
    auto b = cursor.next(o.batch);
    auto s = backend->train_step(params.data(), b, grad.data());
    if (!s)
      return false;
    sgd_apply(opt, 1.0f, params.data(), velocity.data(), grad.data(), params.size());
    return true;
  };
  for (uint32_t i = 0; i < o.warmup; ++i)
    if (!step())
      return 1;
  auto t0 = steady_now();
  for (uint32_t i = 0; i < o.steps; ++i)
    if (!step())
      return 1;
  double secs = std::chrono::duration<double>(steady_now() - t0).count();
  double us_step = secs * 1e6 / o.steps;
  double us_sample = us_step / o.batch;
  const auto details = backend->details();
  if (o.json)
    std::printf("{\"framework\": \"ashlar\", \"model\": \"%s\", \"batch\": %u, \"threads\": %d, "
                "\"us_per_step\": %.3f, \"us_per_sample\": %.4f, \"kernels\": \"%s\"}\n",
                spec.to_string().c_str(), o.batch, o.threads, us_step, us_sample, details.c_str());
  else
    std::printf("ashlar cpu step: model %s, batch %u, %d thread(s): %.1f us/step, %.3f us/sample%s%s\n",
                spec.to_string().c_str(), o.batch, o.threads, us_step, us_sample, details.empty() ? "" : "\n  ",
                details.c_str());
  return 0;
}

struct wire_options {
  uint64_t params = 6000000;
  double seconds = 5;
  uint64_t chunk = train_config{}.chunk_floats;
  uint32_t window = train_config{}.chunks_in_flight;
  std::string port_file;
  std::string tls_dir;
  bool unsealed = false;
  bool tcp_only = false;
  bool json = false;
};

// The peer process: one shard holding `params` floats, published on loopback.
// Both processes of the wire bench admit each other with the token the bench set in
// $ASHLAR_TOKEN (and TLS with --tls).
expected<std::shared_ptr<actors::cluster_network>> bench_network(caf::actor_system& sys, const wire_options& o) {
  security_options so;
  so.tls_dir = o.tls_dir;
  auto sec = load_security(so);
  if (!sec)
    return sec.error();
  sec->seal_records = !o.unsealed;
  return actors::cluster_network::start(sys, *sec);
}

int run_wire_peer(const wire_options& o) {
  actors::cluster_system_config cfg;
  caf::actor_system sys{cfg};
  auto network = bench_network(sys, o);
  if (!network) {
    std::fprintf(stderr, "ashlar bench wire-peer: %s\n", describe(network.error()).c_str());
    return 1;
  }
  auto policy = make_policy("asp", {});
  sgd_config opt;
  opt.lr = 1e-6f;
  opt.momentum = 0;
  opt.weight_decay = 0;
  actors::data_plane plane{sys};
  auto core = std::make_unique<shard_core>(shard_range{0, 0, o.params}, std::vector<float>(o.params, 0.5f), opt,
                                           std::move(*policy));
  core->use_storage(plane.tensor_buffers("bench"), plane.tensor_reclaim("bench")); // as a node does
  auto shard = actors::spawn_shard(sys, std::move(core));
  caf::scoped_actor self{sys};
  self->request(shard, std::chrono::seconds(5), wire::membership_change{wire::membership_change::join, 0, ""})
    .receive([](uint64_t) {}, [](caf::error&) {});
  auto port = (*network)->publish(sys, shard, actors::endpoint{"127.0.0.1", 0});
  if (!port)
    return 1;
  auto data_ep = plane.serve(0, shard, "bench", "127.0.0.1", o.params);
  if (!data_ep)
    return 1;
  {
    std::ofstream out{o.port_file + ".tmp"};
    out << *port << " " << *data_ep << "\n";
  }
  std::rename((o.port_file + ".tmp").c_str(), o.port_file.c_str());
  // Runs until the parent kills it.
  for (;;)
    pause_for(std::chrono::seconds(1));
}

struct wire_figure {
  uint64_t bytes = 0;
  uint64_t rounds = 0;
  double seconds = 0;
  double rate() const { return seconds > 0 ? bytes / seconds : 0; }
};

// Pull + push rounds of the whole shard against `shard` for `seconds`, in chunks of
// `chunk` floats with `window` chunks in flight, as a worker moves its tensors.
expected<wire_figure> measure_rounds(caf::actor_system& sys, const actors::shard_actor& shard, uint64_t params,
                                     uint64_t chunk, uint32_t window, double seconds) {
  caf::scoped_actor self{sys};
  std::vector<float> grad(params, 0.25f);
  wire_figure f;
  caf::error failure;
  auto on_error = [&](caf::error& e) { failure = e; };
  const auto timeout = std::chrono::seconds(60);
  auto t0 = steady_now();
  while (f.seconds < seconds && !failure) {
    // Pull: the first reply names the read; then `window` chunk requests outstanding.
    uint64_t version = 0, read_id = 0, next = 0;
    auto take = [&](const wire::pull_reply& r) {
      f.bytes += r.params.size() * 4;
      version = r.version;
      read_id = r.read_id;
    };
    self->request(shard, timeout, wire::pull_request{0, 0, false, 0, chunk, 0}).receive(take, on_error);
    next = std::min(params, chunk == 0 ? params : chunk);
    std::deque<decltype(self->request(shard, timeout, wire::pull_request{}))> inflight;
    while (!failure && (next < params || !inflight.empty())) {
      while (next < params && inflight.size() < window) {
        inflight.push_back(self->request(shard, timeout, wire::pull_request{0, 0, false, next, chunk, read_id}));
        next = std::min(params, next + chunk);
      }
      inflight.front().receive(take, on_error);
      inflight.pop_front();
    }
    // Push, the same way.
    next = 0;
    std::deque<decltype(self->request(shard, timeout, wire::push{}))> pushes;
    while (!failure && (next < params || !pushes.empty())) {
      while (next < params && pushes.size() < window) {
        uint64_t len = chunk == 0 ? params : std::min(chunk, params - next);
        wire::push p;
        p.batch_size = 1;
        p.base_version = version;
        p.offset = next;
        p.total = chunk == 0 ? 0 : params;
        p.grad.assign(grad.begin() + next, grad.begin() + next + len);
        pushes.push_back(self->request(shard, timeout, std::move(p)));
        next += len;
      }
      pushes.front().receive([&](const wire::push_ack&) {}, on_error);
      pushes.pop_front();
    }
    f.bytes += params * 4;
    ++f.rounds;
    f.seconds = std::chrono::duration<double>(steady_now() - t0).count();
  }
  if (failure)
    return failure;
  return f;
}

// The wire bench's figures: the data plane's (over `path`) and CAF's.
void print_wire(const wire_options& o, bool over_shm, const wire_figure& dp, const wire_figure& caf_fig) {
  const auto* d = &dp;
  const auto* c = &caf_fig;
  if (o.json)
    std::printf("{\"path\": \"%s\", \"params\": %lu, \"rounds\": %lu, \"seconds\": %.3f, \"bytes\": %lu, "
                "\"bytes_per_second\": %.0f, \"caf_rounds\": %lu, \"caf_bytes_per_second\": %.0f}\n",
                over_shm ? "shm" : "tcp", static_cast<unsigned long>(o.params), static_cast<unsigned long>(d->rounds), d->seconds,
                static_cast<unsigned long>(d->bytes), d->rate(), static_cast<unsigned long>(c->rounds),
                c->rate());
  else
    std::printf("ashlar wire, %lu-parameter shard in another process:\n"
                "  data plane (%s): %lu pull+push rounds in %.1f s: %.1f MB/s\n"
                "  CAF middleman: %lu pull+push rounds in %.1f s: %.1f MB/s\n",
                static_cast<unsigned long>(o.params), over_shm ? "shared memory" : "TCP",
                static_cast<unsigned long>(d->rounds), d->seconds, d->rate() / 1e6,
                static_cast<unsigned long>(c->rounds), c->seconds, c->rate() / 1e6);
}

// Pull + push of a `params`-float shard in another process, as fast as one worker can:
// over the data plane (what workers use between processes) and over CAF's middleman.
int run_wire_bench(const wire_options& o) {
  char tmpl[] = "/tmp/ashlar-bench-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::string port_file = dir + "/port";
  if (!std::getenv("ASHLAR_TOKEN"))
    ::setenv("ASHLAR_TOKEN", make_token().c_str(), 1); // the peer inherits it
  std::vector<std::string> peer_argv = {self_executable(), "bench", "wire-peer", "--params", std::to_string(o.params),
                                        "--port-file", port_file};
  if (!o.tls_dir.empty())
    peer_argv.insert(peer_argv.end(), {"--tls", o.tls_dir});
  if (o.unsealed)
    peer_argv.push_back("--unsealed");
  auto peer = subprocess::start(peer_argv, dir + "/peer.log");
  if (!peer) {
    std::fprintf(stderr, "ashlar bench: %s\n", describe(peer.error()).c_str());
    return 1;
  }
  std::string port, data_ep;
  for (int i = 0; i < 200 && port.empty(); ++i) {
    std::ifstream in{port_file};
    in >> port >> data_ep;
    if (port.empty())
      pause_for(std::chrono::milliseconds(50));
  }
  auto cleanup = [&] {
    peer->signal(SIGKILL);
    peer->wait(5);
    std::remove(port_file.c_str());
    std::remove((dir + "/peer.log").c_str());
    ::rmdir(dir.c_str());
  };
  if (port.empty()) {
    std::fprintf(stderr, "ashlar bench: the peer process did not start\n");
    cleanup();
    return 1;
  }
  actors::cluster_system_config cfg;
  caf::actor_system sys{cfg};
  auto network = bench_network(sys, o);
  if (!network) {
    std::fprintf(stderr, "ashlar bench: %s\n", describe(network.error()).c_str());
    cleanup();
    return 1;
  }
  auto ptr = actors::connect(sys, actors::endpoint{"127.0.0.1", static_cast<uint16_t>(std::stoi(port))},
                             std::chrono::seconds(10));
  if (!ptr) {
    std::fprintf(stderr, "ashlar bench: %s\n", describe(ptr.error()).c_str());
    cleanup();
    return 1;
  }
  auto shard = caf::actor_cast<actors::shard_actor>(*ptr);
  actors::data_plane plane{sys};
  plane.use_shared_memory(!o.tcp_only);
  caf::scoped_actor owner{sys};
  auto direct = plane.connect(shard, 0, data_ep, "bench", caf::actor_cast<caf::actor>(owner),
                              std::chrono::seconds(5));
  const bool over_shm = plane.shared_memory_connections() > 0;
  expected<wire_figure> d = direct ? measure_rounds(sys, *direct, o.params, o.chunk, o.window, o.seconds) : direct.error();
  auto c = measure_rounds(sys, shard, o.params, o.chunk, o.window, o.seconds);
  if (direct)
    caf::anon_send_exit(*direct, caf::exit_reason::user_shutdown);
  plane.stop();
  cleanup();
  if (!d || !c) {
    std::fprintf(stderr, "ashlar bench: %s\n", describe(!d ? d.error() : c.error()).c_str());
    return 1;
  }
  print_wire(o, over_shm, *d, *c);
  return 0;
}

}  // namespace

command_fn add_bench(CLI::App& app) {
  auto o = std::make_shared<bench_options>();
  auto* cmd = app.add_subcommand("bench", "Benchmarks that print figures");
  cmd->require_subcommand(1);
  auto* step = cmd->add_subcommand("step", "CPU training step time per sample (forward, backward, SGD)");
  step->add_option("--batch", o->batch, "mini-batch size")->capture_default_str();
  step->add_option("--hidden", o->hidden, "hidden widths, comma-separated")->capture_default_str();
  step->add_option("--config", o->config, "take the model from this config file (e.g. ops/configs/fmnist-cnn.toml) "
                                          "instead of --hidden");
  step->add_option("--steps", o->steps, "timed steps")->capture_default_str();
  step->add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str();
  step->add_option("--threads", o->threads, "compute threads (OpenBLAS, oneDNN)")->capture_default_str();
  step->add_option("--conv", o->conv, "conv2d kernels: measure (the faster per layer), onednn or im2col")
    ->check(CLI::IsMember({"measure", "onednn", "im2col"}))
    ->capture_default_str();
  step->add_flag("--json", o->json, "print one JSON object");
  auto w = std::make_shared<wire_options>();
  auto* wire_cmd = cmd->add_subcommand("wire", "pull+push bytes/s with a shard in another process");
  wire_cmd->add_option("--params", w->params, "parameters in the shard")->capture_default_str();
  wire_cmd->add_option("--seconds", w->seconds, "how long to measure")->capture_default_str();
  wire_cmd->add_option("--chunk", w->chunk, "floats per message (0: whole shard), as train.chunk_floats")
    ->capture_default_str();
  wire_cmd->add_option("--window", w->window, "chunks in flight, as train.chunks_in_flight (1-16)")
    ->capture_default_str()->check(CLI::Range(1u, 16u));
  wire_cmd->add_flag("--json", w->json, "print one JSON object");
  wire_cmd->add_flag("--tcp", w->tcp_only, "the data plane over TCP even though the peer is on this host (by "
                                           "default it switches to shared memory)");
  wire_cmd->add_option("--tls", w->tls_dir, "both processes use mutual TLS with this directory's credentials");
  wire_cmd->add_flag("--unsealed", w->unsealed,
                     "without TLS, both processes send plain bytes after the handshake instead of sealed "
                     "records (to measure what sealing costs; nodes always seal)");
  auto* peer_cmd = cmd->add_subcommand("wire-peer", "the other process of `bench wire`");
  peer_cmd->group("");
  peer_cmd->add_option("--params", w->params)->required();
  peer_cmd->add_option("--port-file", w->port_file)->required();
  peer_cmd->add_option("--tls", w->tls_dir);
  peer_cmd->add_flag("--unsealed", w->unsealed);
  auto h = std::make_shared<hetero_options>();
  auto* hetero_cmd = cmd->add_subcommand("hetero", "every sync policy on the same paced heterogeneous workers: "
                                                   "time to target accuracy, throughput, staleness");
  add_hetero_options(hetero_cmd, *h);
  hetero_cmd->footer("Example:\n  ashlar bench hetero ops/configs/fmnist-mlp.toml --speeds 1,1,2,4 --out results\n"
                     "  (add --policy-set asp:train.lr=0.02 for a setting that applies to one policy)");
  auto g = std::make_shared<gpu_bench_options>();
  auto* gpu_cmd = cmd->add_subcommand("gpu", "one GPU worker's samples/s per model, and its GEMM rate against "
                                             "cuBLAS alone on the same shapes");
  add_gpu_bench_options(gpu_cmd, *g);
  gpu_cmd->footer("Example:\n  ashlar bench gpu --hidden 256,128 --hidden 4096,4096 --batch 256\n"
                  "  (ops/gpu.sh runs it beside PyTorch on a GPU machine)");
  auto t = std::make_shared<transport_options>();
  CLI::App* transport_cmd = nullptr;
  CLI::App* transport_peer = nullptr;
  add_transport_bench(cmd, *t, transport_cmd, transport_peer);
  return [o, step, w, wire_cmd, peer_cmd, h, hetero_cmd, g, gpu_cmd, t, transport_cmd, transport_peer] {
    if (transport_cmd->parsed() || transport_peer->parsed()) {
      if (init_logging("warn"))
        return 2;
      return run_transport(*t, transport_peer->parsed());
    }
    if (gpu_cmd->parsed()) {
      if (init_logging("warn"))
        return 2;
      return run_gpu_bench(*g);
    }
    if (hetero_cmd->parsed()) {
      if (init_logging("warn"))
        return 2;
      return run_hetero_bench(*h);
    }
    if (step->parsed())
      return run_step_bench(*o);
    if (wire_cmd->parsed())
      return init_logging("warn") ? 2 : run_wire_bench(*w);
    if (peer_cmd->parsed())
      return run_wire_peer(*w);
    return 2;
  };
}

}  // namespace ashlar::cli
