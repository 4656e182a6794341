// `ashlar bench transport`: what the data plane moves between two processes of this host,
// per path (shared memory, TCP), for one push and one pull of a tensor of each size, beside
// a single-thread memcpy of the same size: the data plane's cost with no shard work in it
// (the peer's shard answers pulls from a buffer and acknowledges pushes without applying
// them). Both ends are set up as a node's: the same scheduler, the shard's buffer where a
// node keeps a shard's parameters (in the job's shared memory, read in place by the
// workers of its host), and the push's gradient in the worker's memory, copied into the
// transport by the push.
#include "apps/ashlar/bench_transport.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <unistd.h>

#include "actors/cluster/data_plane.hpp"
#include "actors/cluster/system.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/net/gate.hpp"
#include "runtime/os/memory.hpp"
#include "runtime/os/subprocess.hpp"

namespace ashlar::cli {

namespace {

// Answers a pull for n floats (pull_request::max_floats) with n floats of its buffer, and
// every push with an acknowledgement; applies nothing. Each reply names a new version, as
// if a push had been applied in between (a version that had to be copied for the peer
// would be copied for each reply).
actors::shard_actor::behavior_type sink_shard(actors::shard_actor::pointer, wire::shared_tensor buf) {
  auto version = std::make_shared<uint64_t>(0);
  return {
    [=](wire::pull_request& r) {
      wire::pull_reply rep;
      rep.version = ++*version;
      const size_t n = std::min<size_t>(r.max_floats == 0 ? buf.size() : r.max_floats, buf.size());
      rep.params = buf.window(0, n);
      return rep;
    },
    [=](wire::push&) { return wire::push_ack{}; },
    [=](wire::membership_change&) { return uint64_t{0}; },
    [=](actors::status_atom) { return wire::shard_status{}; },
    [=](actors::tune_atom, uint32_t, bool) {},
    [=](actors::bound_atom, uint64_t, float) {},
    [=](actors::lr_atom, float) {},
    [=](actors::checkpoint_atom, uint64_t, uint64_t, uint64_t) { return uint64_t{0}; },
    [=](actors::checkpoint_atom, caf::get_atom) { return std::vector<uint64_t>{}; },
    [=](actors::restore_atom, uint64_t) { return uint64_t{0}; },
    [=](actors::restore_atom, std::vector<float>&) { return uint64_t{0}; },
    [=](actors::checkpoint_atom) { return uint64_t{0}; },
  };
}

std::vector<uint64_t> parse_sizes(const std::string& text) {
  std::vector<uint64_t> out;
  std::stringstream in{text};
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty())
      out.push_back(std::stoull(item));
  return out;
}

// Seconds per call of f, over at least `min_seconds` (and 3 calls), after two untimed
// calls (the buffers a path keeps are then made: over shared memory, a version's copy
// and the one before it); `prepare` runs before each call, outside the time.
template <class P, class F>
double seconds_per_call(P&& prepare, F&& f, double min_seconds) {
  for (int i = 0; i < 2; ++i) {
    prepare();
    f();
  }
  int calls = 0;
  std::chrono::steady_clock::duration spent{};
  while (calls < 3 || std::chrono::duration<double>(spent).count() < min_seconds) {
    prepare();
    const auto t0 = steady_now();
    f();
    spent += steady_now() - t0;
    ++calls;
  }
  return std::chrono::duration<double>(spent).count() / calls;
}

template <class F>
double seconds_per_call(F&& f, double min_seconds) {
  return seconds_per_call([] {}, std::forward<F>(f), min_seconds);
}

struct path_figures {
  double push = 0, pull = 0; // seconds per call
};

expected<path_figures> measure_path(caf::actor_system& sys, const actors::shard_actor& stand_in,
                                    const std::string& endpoint, bool shm, uint64_t floats, double min_seconds) {
  actors::data_plane plane{sys};
  plane.use_shared_memory(shm);
  caf::scoped_actor self{sys};
  auto shard = plane.connect(stand_in, 0, endpoint, "bench", caf::actor_cast<caf::actor>(self),
                             std::chrono::seconds(10));
  if (!shard)
    return shard.error();
  caf::error failure;
  const auto timeout = std::chrono::seconds(60);
  std::vector<float> grad(floats, 0.25f);
  path_figures out;
  out.pull = seconds_per_call(
    [&] {
      self->request(*shard, timeout, wire::pull_request{0, 0, false, 0, floats, 0})
        .receive([](wire::pull_reply&) {}, [&](caf::error& e) { failure = e; });
    },
    min_seconds);
  wire::push p;
  out.push = seconds_per_call(
    [&] { // a worker's push owns its gradient, made before it is sent
      p = wire::push{};
      p.batch_size = 1;
      p.grad.assign(grad.begin(), grad.end());
    },
    [&] {
      self->request(*shard, timeout, std::move(p))
        .receive([](wire::push_ack&) {}, [&](caf::error& e) { failure = e; });
    },
    min_seconds);
  caf::anon_send_exit(*shard, caf::exit_reason::user_shutdown);
  plane.stop();
  if (failure)
    return failure;
  return out;
}

int run_transport_peer(const transport_options& o) {
  actors::cluster_system_config cfg; // as a node's: the same scheduler
  caf::actor_system sys{cfg};
  actors::data_plane plane{sys};
  // The buffer where a node keeps a shard's parameters (shard_core::use_storage): the
  // job's shared memory where the data plane offers it, else the heap.
  const auto storage = plane.tensor_buffers("bench");
  std::shared_ptr<float> at = storage ? storage(o.peer_floats) : nullptr;
  if (!at) {
    auto heap = std::make_shared<std::vector<float>>(o.peer_floats);
    prefer_huge_pages(heap->data(), heap->size() * sizeof(float));
    at = std::shared_ptr<float>(heap, heap->data());
  }
  std::fill(at.get(), at.get() + o.peer_floats, 0.5f);
  auto shard = sys.spawn(sink_shard, wire::shared_tensor{at, o.peer_floats});
  auto ep = plane.serve(0, shard, "bench", "127.0.0.1");
  if (!ep) {
    std::fprintf(stderr, "ashlar bench transport-peer: %s\n", describe(ep.error()).c_str());
    return 1;
  }
  {
    std::ofstream out{o.port_file + ".tmp"};
    out << *ep << "\n";
  }
  std::rename((o.port_file + ".tmp").c_str(), o.port_file.c_str());
  for (;;) // until the bench kills it
    pause_for(std::chrono::seconds(1));
}

int run_transport_bench(const transport_options& o) {
  const auto sizes = parse_sizes(o.sizes_mb);
  if (sizes.empty() || *std::max_element(sizes.begin(), sizes.end()) > 200) {
    std::fprintf(stderr, "ashlar bench transport: --sizes takes MB from 1 to 200, comma-separated\n");
    return 2;
  }
  const uint64_t max_floats = (*std::max_element(sizes.begin(), sizes.end()) << 20) / sizeof(float);
  char tmpl[] = "/tmp/ashlar-bench-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string port_file = dir + "/port";
  auto peer = subprocess::start({self_executable(), "bench", "transport-peer", "--floats", std::to_string(max_floats),
                                 "--port-file", port_file},
                                dir + "/peer.log");
  if (!peer) {
    std::fprintf(stderr, "ashlar bench transport: %s\n", describe(peer.error()).c_str());
    return 1;
  }
  auto cleanup = [&] {
    peer->signal(SIGKILL);
    peer->wait(5);
    std::remove(port_file.c_str());
    std::remove((dir + "/peer.log").c_str());
    ::rmdir(dir.c_str());
  };
  std::string endpoint;
  for (int i = 0; i < 200 && endpoint.empty(); ++i) {
    std::ifstream in{port_file};
    in >> endpoint;
    if (endpoint.empty())
      pause_for(std::chrono::milliseconds(50));
  }
  if (endpoint.empty()) {
    std::fprintf(stderr, "ashlar bench transport: the peer process did not start\n");
    cleanup();
    return 1;
  }
  actors::cluster_system_config cfg; // as a node's: the same scheduler
  caf::actor_system sys{cfg};
  // Stands in for the shard's CAF handle (never used while the data connection holds).
  auto stand_in = sys.spawn(sink_shard, wire::shared_tensor{});
  if (!o.json)
    std::printf("%-8s %10s %10s %10s %10s %10s %14s %10s\n", "size MB", "memcpy", "shm push", "shm pull", "TCP push",
                "TCP pull", "shm/memcpy", "shm/TCP");
  int rc = 0;
  for (uint64_t mb : sizes) {
    const uint64_t bytes = mb << 20, floats = bytes / sizeof(float);
    std::vector<float> src(floats, 1.0f), dst(floats, 0.0f);
    prefer_huge_pages(src.data(), bytes); // as the data plane's buffers: the same pages for both
    prefer_huge_pages(dst.data(), bytes);
    const double copy = seconds_per_call([&] { std::memcpy(dst.data(), src.data(), bytes); }, o.seconds);
    auto shm = measure_path(sys, stand_in, endpoint, true, floats, o.seconds);
    auto tcp = measure_path(sys, stand_in, endpoint, false, floats, o.seconds);
    if (!shm || !tcp) {
      std::fprintf(stderr, "ashlar bench transport: %s\n", describe(!shm ? shm.error() : tcp.error()).c_str());
      rc = 1;
      break;
    }
    auto gbs = [&](double secs) { return bytes / secs / 1e9; };
    const double shm_both = 2 * bytes / (shm->push + shm->pull) / 1e9;
    const double tcp_both = 2 * bytes / (tcp->push + tcp->pull) / 1e9;
    if (o.json)
      std::printf("{\"mb\": %lu, \"memcpy_gbs\": %.3f, \"shm_push_gbs\": %.3f, \"shm_pull_gbs\": %.3f, "
                  "\"tcp_push_gbs\": %.3f, \"tcp_pull_gbs\": %.3f, \"shm_gbs\": %.3f, \"tcp_gbs\": %.3f}\n",
                  static_cast<unsigned long>(mb), gbs(copy), gbs(shm->push), gbs(shm->pull), gbs(tcp->push),
                  gbs(tcp->pull), shm_both, tcp_both);
    else
      std::printf("%-8lu %10.2f %10.2f %10.2f %10.2f %10.2f %14.2f %10.2f\n", static_cast<unsigned long>(mb),
                  gbs(copy), gbs(shm->push), gbs(shm->pull), gbs(tcp->push), gbs(tcp->pull), shm_both / gbs(copy),
                  shm_both / tcp_both);
    std::fflush(stdout);
  }
  if (!o.json && rc == 0)
    std::printf("GB/s; shm/memcpy and shm/TCP compare push+pull (2 x size over the two calls' time); over shared "
                "memory a push copies the tensor once and a pull hands over the shard's version where it lies (what "
                "the worker copies of it afterwards is its own)\n");
  caf::anon_send_exit(stand_in, caf::exit_reason::user_shutdown);
  cleanup();
  return rc;
}

} // namespace

void add_transport_bench(CLI::App* bench, transport_options& o, CLI::App*& cmd, CLI::App*& peer_cmd) {
  cmd = bench->add_subcommand("transport", "push and pull of one tensor between two processes of this host, "
                                           "per path (shared memory, TCP), beside memcpy");
  cmd->add_option("--sizes", o.sizes_mb, "tensor sizes in MB, comma-separated")->capture_default_str();
  cmd->add_option("--seconds", o.seconds, "at least this long per figure")->capture_default_str();
  cmd->add_flag("--json", o.json, "print one JSON object per size");
  peer_cmd = bench->add_subcommand("transport-peer", "the other process of `bench transport`");
  peer_cmd->group("");
  peer_cmd->add_option("--floats", o.peer_floats)->required();
  peer_cmd->add_option("--port-file", o.port_file)->required();
}

int run_transport(const transport_options& o, bool peer) {
  // Both processes admit each other with one token (the peer inherits it).
  if (!std::getenv("ASHLAR_TOKEN"))
    ::setenv("ASHLAR_TOKEN", net::random_hex(16).c_str(), 1);
  return peer ? run_transport_peer(o) : run_transport_bench(o);
}

}  // namespace ashlar::cli
