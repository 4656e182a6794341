// The cluster as an attacker on loopback meets it: real `ashlar` processes, raw sockets.
// Every request without credentials is refused, oversized announcements are dropped
// before allocation, half-open connections hold no thread, TLS refuses strangers with a
// clear error, and a job trained under all of it ends where it would have.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>

#include <arpa/inet.h>
#include <caf/binary_serializer.hpp>
#include <caf/io/basp/header.hpp>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/cluster/network.hpp"
#include "actors/cluster/system.hpp"
#include "actors/local_job.hpp"
#include "actors/interfaces.hpp"
#include "runtime/net/gate.hpp"
#include "runtime/net/records.hpp"
#include "runtime/net/tls.hpp"
#include "process_helpers.hpp"

using namespace ashlar;
using namespace ashlar::test;

namespace {

const std::string token = "cluster-process-test-token"; // process_helpers sets it for children

// A TCP connection to `join`; -1 if refused.
int try_connect(const std::string& join) {
  auto colon = join.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(join.substr(colon + 1))));
  ::inet_pton(AF_INET, join.substr(0, colon).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    fd = -1;
  }
  return fd;
}

int raw_connect(const std::string& join) {
  int fd = try_connect(join);
  REQUIRE(fd >= 0);
  return fd;
}

// True if the peer closes `fd` within `limit` (reads and drops whatever it sends first).
bool closed_by_peer(int fd, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0)
      continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      return true;
  }
  return false;
}

// Passes the token gate as a client on a blocking socket; `keys` gets the record keys.
// `pause` before each answer: a peer far away (each round trip that long).
bool pass_gate(int fd, const std::string& tok, net::session_keys* keys = nullptr,
               std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
  net::gate_client c{tok};
  while (c.state() == net::gate_state::running) {
    auto out = c.take_output();
    if (!out.empty() && pause.count() > 0)
      std::this_thread::sleep_for(pause);
    if (!out.empty() && ::send(fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size()))
      return false;
    uint8_t buf[64];
    ssize_t n = ::recv(fd, buf, std::min(sizeof buf, c.wants()), 0);
    if (n <= 0)
      return false;
    c.feed(buf, static_cast<size_t>(n));
  }
  if (keys)
    *keys = c.keys();
  return c.state() == net::gate_state::admitted;
}

// `bytes` as one sealed record from the client side of a connection keyed `keys`.
std::vector<uint8_t> sealed_record(const net::session_keys& keys, const std::vector<char>& bytes) {
  net::record_writer w{keys.client_tx};
  REQUIRE(w.seal(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == bytes.size());
  size_t n = 0;
  const uint8_t* p = w.pending(n);
  return {p, p + n};
}

// A BASP header as CAF writes it, announcing `payload` bytes.
std::vector<char> basp_header(uint32_t payload) {
  caf::io::basp::header hdr{caf::io::basp::message_type::direct_message, 0, payload, 0, 1, 1};
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  REQUIRE_FALSE(sink(hdr));
  REQUIRE(buf.size() == 32);
  return buf;
}

long field_of(int pid, const char* file, const char* key) {
  auto text = slurp("/proc/" + std::to_string(pid) + "/" + file);
  auto at = text.find(key);
  if (at == std::string::npos)
    return -1;
  return std::atol(text.c_str() + at + std::strlen(key));
}

long rss_mb(int pid) {
  return field_of(pid, "status", "VmRSS:") / 1024;
}

long threads(int pid) {
  return field_of(pid, "status", "Threads:");
}

// `ashlar ARGS...` without the cluster token in its environment.
std::vector<std::string> stranger(std::vector<std::string> args) {
  std::vector<std::string> argv = {"/usr/bin/env", "-u", "ASHLAR_TOKEN", exe};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

int status_rc(const temp_dir& dir, const std::string& join, const std::string& log) {
  auto p = start({exe, "status", "--join", join}, dir.file(log));
  return p.wait(30);
}

} // namespace

TEST_CASE("the frame guard reads BASP headers as CAF writes them") {
  net::basp_frame_guard guard{1000};
  auto ok = basp_header(1000);
  CHECK(guard.inspect(reinterpret_cast<const uint8_t*>(ok.data()), ok.size()));
  std::vector<uint8_t> payload(1000);
  CHECK(guard.inspect(payload.data(), payload.size()));
  auto huge = basp_header(1001);
  CHECK_FALSE(guard.inspect(reinterpret_cast<const uint8_t*>(huge.data()), huge.size()));
}

TEST_CASE("without the cluster token, status, ctl, a submitted job and a join are refused, and the cluster goes on") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {});
  std::filesystem::create_directories(dir.file("evil"));
  std::vector<std::pair<std::vector<std::string>, std::string>> attempts = {
    {{"status", "--join", sched.join}, "status"},
    {{"ctl", "shutdown", "--join", sched.join}, "ctl"},
    {{"train", config, "--join", sched.join, "--set", "run.trace=" + dir.file("evil/trace.json"), "--set",
      "run.checkpoint_dir=" + dir.file("evil/ck")},
     "train"},
    {{"node", "--role", "worker", "--join", sched.join, "--connect-timeout", "3"}, "node"},
  };
  for (auto& [args, name] : attempts) {
    auto p = start(stranger(args), dir.file(name + ".log"));
    int rc = p.wait(30);
    auto log = slurp(dir.file(name + ".log"));
    INFO(name << ": " << log);
    CHECK(rc == 1);
    CHECK(log.find("the node refused the connection: it expects another cluster token") != std::string::npos);
  }
  // A wrong token fares no better.
  write_token(dir.file("wrong"), "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978"); // strong, and not the token
  auto wrong = start({exe, "ctl", "shutdown", "--join", sched.join, "--token-file", dir.file("wrong")},
                     dir.file("wrong.log"));
  CHECK(wrong.wait(30) == 1);
  // Nothing happened: the scheduler answers its own members, none joined, no file written.
  CHECK(status_rc(dir, sched.join, "ok.log") == 0);
  auto ok = slurp(dir.file("ok.log"));
  CHECK(ok.find("stage: idle") != std::string::npos);
  CHECK(ok.find("nodes (0)") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir.file("evil")));
  auto log = slurp(dir.file("scheduler.log"));
  CHECK(log.find("refused a connection from 127.0.0.1:") != std::string::npos);
  CHECK(log.find(token) == std::string::npos);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(10) == 0);
}

TEST_CASE("a submitted job may write only inside the nodes' work directories, and is told which path is outside") {
  temp_dir dir;
  std::filesystem::create_directories(dir.file("work"));
  write_token(dir.file("work/token"), token); // its own token file, in the work directory
  auto sched = start_scheduler(dir, {"--work-dir", dir.file("work"), "--token-file", dir.file("work/token")});
  auto server = start({exe, "node", "--role", "server", "--join", sched.join, "--work-dir", dir.file("work")},
                      dir.file("server.log"));
  auto worker = start({exe, "node", "--role", "worker", "--slots", "2", "--join", sched.join},
                      dir.file("worker.log"));
  REQUIRE(wait_for_file(dir.file("worker.log"),
                        [](const std::string& t) { return t.find("joined the cluster") != std::string::npos; }, 15s));
  const std::vector<std::string> job = {"train", config, "--join", sched.join, "--workers", "2", "--servers", "1",
                                        "--epochs", "1", "--set", "data.train_limit=3000", "--set",
                                        "data.test_limit=500"};
  for (const std::string& bad : {"run.trace=" + dir.file("outside.json"), std::string{"run.metrics=../escape.jsonl"},
                                 std::string{"run.checkpoint_dir=/etc/ashlar-ck"}}) {
    auto argv = job;
    argv.insert(argv.begin(), exe);
    argv.insert(argv.end(), {"--set", bad});
    auto p = start(argv, dir.file("bad.log"));
    CHECK(p.wait(60) == 1);
    auto log = slurp(dir.file("bad.log"));
    INFO(log);
    CHECK(log.find("lies outside this node's work directory") != std::string::npos);
    CHECK(log.find(bad.substr(bad.find('=') + 1)) != std::string::npos);
  }
  {
    auto argv = job;
    argv.insert(argv.begin(), exe);
    argv.insert(argv.end(), {"--set", "run.trace=token"});
    auto p = start(argv, dir.file("secret.log"));
    CHECK(p.wait(60) == 1);
    CHECK(slurp(dir.file("secret.log")).find("run.trace token would overwrite this node's credentials")
          != std::string::npos);
    CHECK(slurp(dir.file("work/token")) == token + "\n");
  }
  {
    // A model the scheduler's host cannot hold (2.06e9 parameters) is refused there, with
    // the estimate, before anything is allocated; the scheduler serves the next job.
    auto argv = job;
    argv.insert(argv.begin(), exe);
    argv.insert(argv.end(), {"--set", "model.hidden=45000,45000"});
    auto p = start(argv, dir.file("huge.log"));
    CHECK(p.wait(60) == 1);
    INFO(slurp(dir.file("huge.log")));
    CHECK(slurp(dir.file("huge.log")).find("does not fit in this machine's memory") != std::string::npos);
    CHECK(slurp(dir.file("huge.log")).find("the scheduler's host") != std::string::npos);
  }
  {
    // A shard larger than a message between nodes may carry (70 M parameters on one
    // shard, 268 MiB) is refused, saying how many shards the job needs; the server node
    // it would have been sent to stays in the cluster.
    auto argv = job;
    argv.insert(argv.begin(), exe);
    argv.insert(argv.end(), {"--set", "model.hidden=8000,8000"});
    auto p = start(argv, dir.file("wide.log"));
    CHECK(p.wait(60) == 1);
    INFO(slurp(dir.file("wide.log")));
    CHECK(slurp(dir.file("wide.log")).find("give the job at least 2 shards (--servers)") != std::string::npos);
    CHECK(slurp(dir.file("server.log")).find("lost the scheduler") == std::string::npos);
  }
  {
    // What the job would have this host read or bind: a device, a link to one, a FIFO in
    // the work directory, a data set the scheduler does not serve, a listener on every
    // interface of a scheduler that listens on loopback.
    std::filesystem::create_symlink("/dev/zero", dir.file("work/zero"));
    REQUIRE(::mkfifo(dir.file("work/fifo").c_str(), 0600) == 0);
    const std::vector<std::pair<std::string, std::string>> refused = {
      {"train.contention=/dev/zero", "lies outside this node's work directory"},
      {"train.contention=zero", "lies outside this node's work directory"},
      {"train.contention=fifo", "is not a regular file"},
      {"data.dir=/etc", "is not one this scheduler serves"},
      {"train.workers=100000", "the job asks for 100000 workers; this cluster runs at most 4096"},
      {"run.metrics_listen=0.0.0.0:" + std::to_string(20000 + ::getpid() % 20000),
       "a submitted job may listen only on the scheduler's own address"}};
    for (const auto& [setting, why] : refused) {
      auto argv = job;
      argv.insert(argv.begin(), exe);
      argv.insert(argv.end(), {"--set", setting});
      auto p = start(argv, dir.file("host.log"));
      CHECK(p.wait(60) == 1);
      INFO(setting << ": " << slurp(dir.file("host.log")));
      CHECK(slurp(dir.file("host.log")).find(why) != std::string::npos);
    }
  }
  CHECK_FALSE(std::filesystem::exists(dir.file("outside.json")));
  CHECK_FALSE(std::filesystem::exists(dir.file("escape.jsonl")));
  // Relative paths land inside, checkpoints included.
  auto argv = job;
  argv.insert(argv.begin(), exe);
  argv.insert(argv.end(), {"--set", "run.trace=t.json", "--set", "run.checkpoint_dir=ck"});
  auto ok = start(argv, dir.file("ok.log"));
  CHECK(ok.wait(120) == 0);
  INFO(slurp(dir.file("ok.log")) << "\nscheduler: " << slurp(dir.file("scheduler.log")));
  CHECK(std::filesystem::exists(dir.file("work/t.json")));
  CHECK(std::filesystem::exists(dir.file("work/ck")));
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(20) == 0);
  server.wait(20);
  worker.wait(20);
}

TEST_CASE("a 32-byte header announcing 4 GiB is dropped before allocation, from strangers and members alike") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {});
  const int pid = sched.proc.pid();
  REQUIRE(status_rc(dir, sched.join, "before.log") == 0);
  const long rss_before = rss_mb(pid);
  auto header = basp_header(0xFFFFFFFFu);
  // A stranger's bytes never reach CAF: not Ashlar's handshake.
  for (int i = 0; i < 4; ++i) {
    int fd = raw_connect(sched.join);
    ::send(fd, header.data(), header.size(), MSG_NOSIGNAL);
    CHECK(closed_by_peer(fd, 6s));
    ::close(fd);
  }
  // A peer with the token passes the gate; its announcement (sealed, as members send)
  // closes the connection; so does the same header unsealed.
  for (int i = 0; i < 2; ++i) {
    int fd = raw_connect(sched.join);
    net::session_keys keys;
    REQUIRE(pass_gate(fd, token, &keys));
    auto record = sealed_record(keys, header);
    if (i == 0)
      ::send(fd, record.data(), record.size(), MSG_NOSIGNAL);
    else
      ::send(fd, header.data(), header.size(), MSG_NOSIGNAL);
    CHECK(closed_by_peer(fd, 6s));
    ::close(fd);
  }
  CHECK(status_rc(dir, sched.join, "after.log") == 0);
  const long rss_after = rss_mb(pid);
  INFO("RSS " << rss_before << " MB -> " << rss_after << " MB");
  CHECK(rss_after < rss_before + 64);
  auto log = slurp(dir.file("scheduler.log"));
  CHECK(log.find("it is not an Ashlar node") != std::string::npos);
  CHECK(log.find("it announced a message of 4294967295 bytes, more than the limit of 268435456") != std::string::npos);
  CHECK(log.find("not a sealed Ashlar stream") != std::string::npos);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(10) == 0);
}

TEST_CASE("64 members each announcing the largest message hold at most the process's 1 GiB in flight, and the "
          "scheduler answers on") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {});
  const int pid = sched.proc.pid();
  REQUIRE(status_rc(dir, sched.join, "before.log") == 0);
  const long rss_before = rss_mb(pid);
  auto announce = basp_header(256u << 20);
  announce.resize(announce.size() + 4096, 'x'); // and the first 4 KiB of it
  std::vector<int> held;
  for (int i = 0; i < 64; ++i) {
    int fd = raw_connect(sched.join);
    net::session_keys keys;
    REQUIRE(pass_gate(fd, token, &keys));
    auto record = sealed_record(keys, announce);
    ::send(fd, record.data(), record.size(), MSG_NOSIGNAL);
    held.push_back(fd);
  }
  std::this_thread::sleep_for(1s);
  const long rss_after = rss_mb(pid);
  INFO("RSS " << rss_before << " MB -> " << rss_after << " MB");
  CHECK(rss_after < rss_before + 1024 + 64);
  CHECK(status_rc(dir, sched.join, "during.log") == 0);
  int closed = 0;
  for (int fd : held)
    closed += closed_by_peer(fd, 100ms);
  CHECK(closed >= 60); // the four the budget took stay open, waiting for their bytes
  for (int fd : held)
    ::close(fd);
  // (The refusals are logged as the scheduler's network gets to them: on a loaded machine
  // a little after the connections closed.)
  const std::string refusal = "the process takes at most 1073741824 in flight (--max-in-flight-mb)";
  auto log = slurp(dir.file("scheduler.log"));
  for (int i = 0; i < 50 && log.find(refusal) == std::string::npos; ++i) {
    std::this_thread::sleep_for(100ms);
    log = slurp(dir.file("scheduler.log"));
  }
  CHECK(log.find(refusal) != std::string::npos);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(10) == 0);
}

namespace {

// A connection to `join` from the local address `from` (another loopback address makes
// another source); -1 if it could not be made.
int connect_from(const std::string& from, const std::string& join) {
  auto colon = join.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(join.substr(colon + 1))));
  ::inet_pton(AF_INET, join.substr(0, colon).c_str(), &a.sin_addr);
  sockaddr_in b{};
  b.sin_family = AF_INET;
  ::inet_pton(AF_INET, from.c_str(), &b.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof b) != 0
      || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Milliseconds each of `n` handshakes from 127.0.0.1 took (connect to admitted), of a
// peer 20 ms away; a refused one counts in `refused`.
std::vector<double> timed_handshakes(const std::string& join, int n, int& refused) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    int fd = connect_from("127.0.0.1", join);
    const bool ok = fd >= 0 && pass_gate(fd, token, nullptr, 20ms);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    refused += !ok;
    if (fd >= 0)
      ::close(fd);
    std::this_thread::sleep_for(30ms);
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

} // namespace

TEST_CASE("under a flood of 5000 connections a second from one source, every handshake from another source (a "
          "peer 20 ms away) is admitted, with little latency added") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {});
  int refused_before = 0;
  auto before = timed_handshakes(sched.join, 16, refused_before);
  CHECK(refused_before == 0);
  std::atomic<bool> stop{false};
  std::atomic<long> made{0};
  // Connections that never speak, from 127.0.0.2, each closed 1 s later (or sooner, if
  // this process would run out of descriptors).
  struct rlimit rl {};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const size_t most_open = std::min<size_t>(5000, rl.rlim_cur > 512 ? rl.rlim_cur - 256 : 256);
  std::thread flood{[&] {
    std::deque<std::pair<std::chrono::steady_clock::time_point, int>> open;
    auto next = std::chrono::steady_clock::now();
    while (!stop) {
      next += std::chrono::microseconds(200);
      int fd = connect_from("127.0.0.2", sched.join);
      const auto now = std::chrono::steady_clock::now();
      if (fd >= 0) {
        ++made;
        open.emplace_back(now, fd);
      }
      while (!open.empty() && (now - open.front().first > 1s || open.size() > most_open)) {
        ::close(open.front().second);
        open.pop_front();
      }
      if (next > now)
        std::this_thread::sleep_until(next);
    }
    for (auto& o : open)
      ::close(o.second);
  }};
  std::this_thread::sleep_for(1s);
  const long at_start = made;
  const auto t0 = std::chrono::steady_clock::now();
  int refused = 0;
  auto during = timed_handshakes(sched.join, 32, refused);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = static_cast<double>(made - at_start) / secs;
  stop = true;
  flood.join();
  const double added = during[during.size() / 2] - before[before.size() / 2];
  INFO("flood " << rate << " connections/s; median handshake " << before[before.size() / 2] << " ms before, "
                << during[during.size() / 2] << " ms during (added " << added << " ms)");
  CHECK(rate > 3000);
  CHECK(refused == 0);
  CHECK(added <= 100);
  CHECK(status_rc(dir, sched.join, "after.log") == 0);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(10) == 0);
}

TEST_CASE("an address holding as many admitted connections as allowed gets no more, while another address gets "
          "in, and gets in again once it closes some") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {"--max-connections-per-address", "8"});
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) {
    int fd = connect_from("127.0.0.2", sched.join);
    REQUIRE(fd >= 0);
    REQUIRE(pass_gate(fd, token));
    held.push_back(fd);
  }
  int ninth = connect_from("127.0.0.2", sched.join);
  REQUIRE(ninth >= 0);
  CHECK_FALSE(pass_gate(ninth, token));
  ::close(ninth);
  CHECK(status_rc(dir, sched.join, "other.log") == 0); // from 127.0.0.1
  for (int fd : held)
    ::close(fd);
  std::this_thread::sleep_for(500ms);
  int again = connect_from("127.0.0.2", sched.join);
  CHECK(pass_gate(again, token));
  ::close(again);
  CHECK(slurp(dir.file("scheduler.log")).find("8 connections from 127.0.0.2 are open, the most one address may hold")
        != std::string::npos);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(10) == 0);
}

TEST_CASE("connections that never finish the handshake hold no thread and are closed by the deadline") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {});
  const int pid = sched.proc.pid();
  REQUIRE(status_rc(dir, sched.join, "before.log") == 0);
  const long threads_before = threads(pid);
  const long rss_before = rss_mb(pid);
  std::vector<int> fds;
  for (int i = 0; i < 100; ++i) {
    fds.push_back(raw_connect(sched.join));
    ::send(fds.back(), "A", 1, MSG_NOSIGNAL); // the first byte of the handshake, then nothing
  }
  // Meanwhile a member is admitted at once.
  auto t0 = std::chrono::steady_clock::now();
  CHECK(status_rc(dir, sched.join, "during.log") == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(threads(pid) <= threads_before + 1);
  CHECK(rss_mb(pid) < rss_before + 16);
  int closed = 0;
  for (int fd : fds) {
    closed += closed_by_peer(fd, 8s) ? 1 : 0;
    ::close(fd);
  }
  CHECK(closed == 100);
  CHECK(slurp(dir.file("scheduler.log")).find("did not finish the handshake within") != std::string::npos);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(10) == 0);
}

TEST_CASE("a node listening beyond loopback needs TLS or --insecure, and says so") {
  temp_dir dir;
  auto p = start({exe, "node", "--role", "scheduler", "--listen", "0.0.0.0:0"}, dir.file("plain.log"));
  CHECK(p.wait(20) == 2);
  CHECK(slurp(dir.file("plain.log")).find("would listen on 0.0.0.0 without TLS") != std::string::npos);
  auto q = start({exe, "node", "--role", "scheduler", "--listen", "0.0.0.0:0", "--insecure", "--port-file",
                  dir.file("port")},
                 dir.file("insecure.log"));
  CHECK(wait_for_file(dir.file("port"), [](const std::string& t) { return !t.empty(); }, 20s));
  q.signal(SIGTERM);
  CHECK(q.wait(10) == 0);
}

TEST_CASE("a TLS cluster trains, while plain commands and another CA's certificates are refused with a clear error") {
  temp_dir dir;
  const std::string ca = dir.file("ca");
  REQUIRE(net::ensure_ca(ca));
  for (const char* name : {"sched", "server", "worker", "client"})
    REQUIRE_FALSE(net::issue_node_cert(ca, dir.file(name), name, 30));
  auto sched = start_scheduler(dir, {"--tls", dir.file("sched"), config, "--exit-after-job", "--workers", "2",
                                     "--servers", "1", "--epochs", "1", "--set", "data.train_limit=6000", "--set",
                                     "data.test_limit=1000", "--report", dir.file("r.json")});
  // Plain, and another CA: refused before anything else.
  auto plain = start({exe, "status", "--join", sched.join}, dir.file("plain.log"));
  CHECK(plain.wait(30) == 1);
  CHECK(slurp(dir.file("plain.log")).find("it requires TLS") != std::string::npos);
  const std::string other = dir.file("other-ca");
  REQUIRE(net::ensure_ca(other));
  REQUIRE_FALSE(net::issue_node_cert(other, dir.file("other"), "other", 30));
  auto foreign = start({exe, "node", "--role", "worker", "--join", sched.join, "--tls", dir.file("other"),
                        "--connect-timeout", "3"},
                       dir.file("foreign.log"));
  CHECK(foreign.wait(30) == 1);
  auto foreign_log = slurp(dir.file("foreign.log"));
  INFO(foreign_log);
  CHECK(foreign_log.find("TLS handshake failed") != std::string::npos);
  // The cluster's own nodes train.
  auto server = start({exe, "node", "--role", "server", "--join", sched.join, "--tls", dir.file("server")},
                      dir.file("server.log"));
  auto worker = start({exe, "node", "--role", "worker", "--slots", "2", "--join", sched.join, "--tls",
                       dir.file("worker")},
                      dir.file("worker.log"));
  int code = sched.proc.wait(240);
  INFO(slurp(dir.file("scheduler.log")));
  REQUIRE(code == 0);
  CHECK(json_number(slurp(dir.file("r.json")), "test_accuracy") > 0.6);
  CHECK(slurp(dir.file("scheduler.log")).find("TLS handshake failed") != std::string::npos);
  server.wait(20);
  worker.wait(20);
}

TEST_CASE("a job trained while strangers flood the scheduler ends with the accuracy it has without them") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {config, "--exit-after-job", "--workers", "2", "--servers", "1", "--epochs", "1",
                                     "--set", "data.train_limit=6000", "--set", "data.test_limit=1000", "--report",
                                     dir.file("r.json")});
  auto server = start({exe, "node", "--role", "server", "--join", sched.join}, dir.file("server.log"));
  auto worker = start({exe, "node", "--role", "worker", "--slots", "2", "--join", sched.join},
                      dir.file("worker.log"));
  std::atomic<bool> done{false};
  std::thread flood{[&] {
    auto header = basp_header(0xFFFFFFFFu);
    std::vector<int> held;
    while (!done) {
      int fd = try_connect(sched.join);
      if (fd < 0) { // the job ended and the scheduler with it
        std::this_thread::sleep_for(20ms);
        continue;
      }
      if (held.size() % 3 == 0)
        ::send(fd, header.data(), header.size(), MSG_NOSIGNAL);
      else
        ::send(fd, "ASH", 3, MSG_NOSIGNAL);
      held.push_back(fd);
      if (held.size() > 200) {
        ::close(held.front());
        held.erase(held.begin());
      }
      std::this_thread::sleep_for(5ms);
    }
    for (int fd : held)
      ::close(fd);
  }};
  int code = sched.proc.wait(240);
  done = true;
  flood.join();
  INFO(slurp(dir.file("scheduler.log")));
  REQUIRE(code == 0);
  train_config cfg;
  REQUIRE_FALSE(apply_toml_file(cfg, config));
  cfg.workers = 2;
  cfg.servers = 1;
  cfg.epochs = 1;
  cfg.train_limit = 6000;
  cfg.test_limit = 1000;
  cfg.progress_interval = 0;
  auto local = actors::run_local_job(cfg);
  REQUIRE(local);
  // BSP with a fixed seed is deterministic: the attack changed nothing.
  CHECK(json_number(slurp(dir.file("r.json")), "test_accuracy") == Approx(local->test_accuracy).margin(1e-9));
  server.wait(20);
  worker.wait(20);
}

namespace {

// A TCP relay on loopback that records every byte it forwards (both directions), as a
// machine between two nodes would see them.
struct relay {
  int listener = -1;
  uint16_t port = 0;
  std::string target;
  std::atomic<bool> stop{false};
  std::mutex mtx;
  std::string seen;
  std::string upstream; // what clients sent (toward the target)
  // When set: a client's first `pass` bytes are forwarded, the rest of what it sends is
  // dropped and `swap_in` goes to the target instead.
  size_t pass = 0;
  std::string swap_in;
  std::thread thread;

  explicit relay(std::string to) : target(std::move(to)) {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener, 16) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread{[this] { run(); }};
  }
  ~relay() {
    stop = true;
    ::shutdown(listener, SHUT_RDWR);
    thread.join();
    ::close(listener);
  }
  std::string captured() {
    std::lock_guard<std::mutex> guard{mtx};
    return seen;
  }
  std::string sent_upstream() {
    std::lock_guard<std::mutex> guard{mtx};
    return upstream;
  }
  void run() {
    std::vector<std::pair<int, int>> pairs;
    std::vector<size_t> forwarded_up;
    while (!stop) {
      std::vector<pollfd> fds{{listener, POLLIN, 0}};
      for (auto& [a, b] : pairs) {
        fds.push_back({a, POLLIN, 0});
        fds.push_back({b, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 100) <= 0)
        continue;
      if (fds[0].revents & POLLIN) {
        int c = ::accept(listener, nullptr, nullptr);
        int s = c >= 0 ? try_connect(target) : -1;
        if (c >= 0 && s >= 0) {
          pairs.emplace_back(c, s);
          forwarded_up.push_back(0);
        }
        else if (c >= 0)
          ::close(c);
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP)))
          continue;
        auto& pr = pairs[(i - 1) / 2];
        int from = (i % 2 == 1) ? pr.first : pr.second, to = (i % 2 == 1) ? pr.second : pr.first;
        char buf[65536];
        ssize_t n = ::recv(from, buf, sizeof buf, 0);
        if (n <= 0) {
          ::shutdown(to, SHUT_WR);
          continue;
        }
        std::lock_guard<std::mutex> guard{mtx};
        seen.append(buf, static_cast<size_t>(n));
        if (i % 2 == 1 && !swap_in.empty()) {
          auto& forwarded = forwarded_up[(i - 1) / 2];
          if (forwarded < pass) {
            auto take = std::min(pass - forwarded, static_cast<size_t>(n));
            (void) ::send(to, buf, take, MSG_NOSIGNAL);
            forwarded += take;
            if (forwarded == pass)
              (void) ::send(to, swap_in.data(), swap_in.size(), MSG_NOSIGNAL);
          }
          continue;
        }
        if (i % 2 == 1)
          upstream.append(buf, static_cast<size_t>(n));
        (void) ::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
      }
    }
    for (auto& [a, b] : pairs) {
      ::close(a);
      ::close(b);
    }
  }
};

} // namespace

TEST_CASE("a relay between a node and the scheduler never sees the token nor anything readable, with or without "
          "TLS") {
  temp_dir dir;
  const std::string ca = dir.file("ca");
  REQUIRE(net::ensure_ca(ca));
  for (const char* name : {"sched", "node"})
    REQUIRE_FALSE(net::issue_node_cert(ca, dir.file(name), name, 30));
  for (bool tls : {false, true}) {
    INFO((tls ? "TLS" : "plain"));
    std::filesystem::remove(dir.file("port"));
    std::vector<std::string> extra;
    if (tls)
      extra = {"--tls", dir.file("sched")};
    auto sched = start_scheduler(dir, extra);
    relay r{sched.join};
    std::vector<std::string> argv = {exe, "node", "--role", "worker", "--name", "relayed-worker-node", "--join",
                                     "127.0.0.1:" + std::to_string(r.port)};
    if (tls)
      argv.insert(argv.end(), {"--tls", dir.file("node")});
    const std::string log = dir.file(tls ? "node-tls.log" : "node-plain.log");
    auto node = start(argv, log);
    REQUIRE(wait_for_file(log,
                          [](const std::string& t) { return t.find("joined the cluster") != std::string::npos; },
                          15s));
    auto bytes = r.captured();
    CHECK(bytes.size() > 100);
    CHECK(bytes.find(token) == std::string::npos);
    // The node's name in its hello: sealed records without TLS, TLS records with it.
    CHECK(bytes.find("relayed-worker-node") == std::string::npos);
    node.signal(SIGTERM);
    node.wait(10);
    sched.proc.signal(SIGTERM);
    CHECK(sched.proc.wait(10) == 0);
  }
}

TEST_CASE("a scheduler started again on the port of a killed one takes up the token it left, so its waiting nodes "
          "join again; a clean stop removes the token, and a token file others can read is never taken up") {
  temp_dir dir;
  auto home = "ASHLAR_HOME=" + dir.path();
  auto scheduler = [&](const std::string& listen, const std::string& log) {
    std::remove(dir.file("port").c_str());
    auto p = start({"/usr/bin/env", "-u", "ASHLAR_TOKEN", home, exe, "node", "--role", "scheduler", "--listen",
                    listen, "--port-file", dir.file("port")},
                   dir.file(log));
    REQUIRE(wait_for_file(dir.file("port"), [](const std::string& t) { return !t.empty(); }, 20s));
    return p;
  };
  auto first = scheduler("127.0.0.1:0", "first.log");
  auto port = slurp(dir.file("port"));
  port.erase(port.find_last_not_of("\n ") + 1);
  const auto join = "127.0.0.1:" + port;
  const auto token_file = dir.file("cluster-" + port + ".token");
  REQUIRE(std::filesystem::exists(token_file));
  auto worker = start(stranger({"node", "--role", "worker", "--join", join, "--token-file", token_file,
                                "--rejoin-timeout", "30"}),
                      dir.file("worker.log"));
  REQUIRE(wait_for_file(dir.file("worker.log"),
                        [](const std::string& t) { return t.find("joined the cluster") != std::string::npos; }, 20s));
  // A client on this host without --token-file finds the token the scheduler wrote for the
  // port; under another home (no token there) it is refused.
  auto status = start({"/usr/bin/env", "-u", "ASHLAR_TOKEN", home, exe, "status", "--join", join},
                      dir.file("status.log"));
  CHECK(status.wait(20) == 0);
  CHECK(slurp(dir.file("status.log")).find("worker") != std::string::npos);
  temp_dir elsewhere;
  auto refused = start({"/usr/bin/env", "-u", "ASHLAR_TOKEN", "ASHLAR_HOME=" + elsewhere.path(), exe, "status",
                        "--join", join},
                       dir.file("refused.log"));
  CHECK(refused.wait(20) != 0);
  first.signal(SIGKILL);
  first.wait(10);
  REQUIRE(wait_for_file(dir.file("worker.log"),
                        [](const std::string& t) { return t.find("waiting up to 30 s") != std::string::npos; }, 10s));
  auto second = scheduler(join, "second.log");
  CHECK(wait_for_file(dir.file("worker.log"),
                      [&](const std::string& t) {
                        return t.find("joined the scheduler at " + join + " again") != std::string::npos;
                      },
                      20s));
  CHECK(slurp(dir.file("second.log")).find("cluster token taken up from " + token_file) != std::string::npos);
  second.signal(SIGTERM);
  CHECK(second.wait(20) == 0);
  CHECK_FALSE(std::filesystem::exists(token_file));

  // A token file others may read is not the scheduler's own: a fresh token is made.
  { std::ofstream{token_file} << std::string(64, 'a') << "\n"; }
  std::filesystem::permissions(token_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write
                                             | std::filesystem::perms::group_read | std::filesystem::perms::others_read);
  auto third = scheduler(join, "third.log");
  auto log = slurp(dir.file("third.log"));
  INFO(log);
  CHECK(log.find("taken up") == std::string::npos);
  CHECK(log.find("cluster token written to " + token_file) != std::string::npos);
  CHECK(slurp(token_file).find(std::string(64, 'a')) == std::string::npos);
  third.signal(SIGTERM);
  CHECK(third.wait(20) == 0);
}

TEST_CASE("a relay without the token that passes a status handshake through and swaps in a recorded ctl "
          "shutdown cannot stop the scheduler") {
  // Recorded on one cluster: the bytes `ctl shutdown` sends after the gate's hello and proof.
  std::string recorded;
  {
    temp_dir dir;
    auto sched = start_scheduler(dir, {});
    relay r{sched.join};
    auto ctl = start({exe, "ctl", "shutdown", "--join", "127.0.0.1:" + std::to_string(r.port)}, dir.file("ctl.log"));
    CHECK(ctl.wait(30) == 0);
    CHECK(sched.proc.wait(30) == 0);
    recorded = r.sent_upstream();
  }
  const size_t gate_bytes = net::gate_hello_bytes + net::gate_mac_bytes;
  REQUIRE(recorded.size() > gate_bytes);
  // Another cluster: a member's `status` passes the gate through the relay, then the relay
  // sends the recording in place of what status sends.
  temp_dir dir;
  auto sched = start_scheduler(dir, {});
  relay r{sched.join};
  {
    std::lock_guard<std::mutex> guard{r.mtx};
    r.pass = gate_bytes;
    r.swap_in = recorded.substr(gate_bytes);
  }
  auto status = start({exe, "status", "--join", "127.0.0.1:" + std::to_string(r.port)}, dir.file("status.log"));
  status.wait(30);
  std::this_thread::sleep_for(2s);
  int code = -1;
  CHECK_FALSE(sched.proc.poll_exit(code));
  CHECK(status_rc(dir, sched.join, "status-after.log") == 0);
  CHECK(slurp(dir.file("scheduler.log")).find("failed authentication") != std::string::npos);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(10) == 0);
}

TEST_CASE("a symbolic link planted in the work directory while a submitted job waits for its nodes does not lead "
          "its files out, and a job that diverges fails with the divergence in its report") {
  temp_dir dir;
  std::filesystem::create_directories(dir.file("work/t"));
  std::filesystem::create_directories(dir.file("outside"));
  auto sched = start_scheduler(dir, {"--work-dir", dir.file("work")});
  auto server = start({exe, "node", "--role", "server", "--join", sched.join, "--work-dir", dir.file("work")},
                      dir.file("server.log"));
  auto submit = start({exe, "train", config, "--join", sched.join, "--workers", "2", "--servers", "1", "--epochs", "1",
                       "--set", "data.train_limit=3000", "--set", "data.test_limit=500", "--set",
                       "run.trace=t/trace.json", "--set", "run.metrics=t/metrics.jsonl"},
                      dir.file("submit.log"));
  REQUIRE(wait_for_file(dir.file("scheduler.log"),
                        [](const std::string& t) { return t.find("running a submitted job") != std::string::npos; },
                        30s));
  // Checked and accepted; now t becomes a link to a directory outside, then the workers come.
  std::filesystem::remove(dir.file("work/t"));
  std::filesystem::create_directory_symlink(dir.file("outside"), dir.file("work/t"));
  auto worker = start({exe, "node", "--role", "worker", "--slots", "2", "--join", sched.join},
                      dir.file("worker.log"));
  CHECK(submit.wait(60) == 1);
  INFO(slurp(dir.file("submit.log")));
  CHECK(slurp(dir.file("submit.log")).find("lies outside this node's work directory") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir.file("outside")));
  CHECK(status_rc(dir, sched.join, "status.log") == 0);
  // The cluster takes the next job: one that diverges fails, and its report says so.
  auto diverged = start({exe, "train", config, "--join", sched.join, "--workers", "2", "--servers", "1", "--epochs", "1",
                         "--set", "data.train_limit=6000", "--set", "data.test_limit=500", "--set", "train.lr=1e30",
                         "--report", dir.file("diverged.json")},
                        dir.file("diverged.log"));
  CHECK(diverged.wait(120) == 1);
  INFO(slurp(dir.file("diverged.log")));
  CHECK(slurp(dir.file("diverged.log")).find("the training diverged") != std::string::npos);
  CHECK(slurp(dir.file("diverged.json")).find("the training diverged") != std::string::npos);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(20) == 0);
  server.wait(20);
  worker.wait(20);
}

TEST_CASE("a member repeating its hello 5000 times over one connection holds one node entry, and a real node joins "
          "meanwhile") {
  temp_dir dir;
  auto sched = start_scheduler(dir, {});
  using namespace ashlar::actors;
  cluster_system_config cfg;
  caf::actor_system sys{cfg};
  net::net_security sec;
  sec.token = "cluster-process-test-token";
  auto net = cluster_network::start(sys, sec);
  REQUIRE(net);
  auto colon = sched.join.rfind(':');
  auto ptr = connect(sys, endpoint{"127.0.0.1", static_cast<uint16_t>(std::stoi(sched.join.substr(colon + 1)))}, 10s);
  REQUIRE(ptr);
  auto cluster = caf::actor_cast<cluster_actor>(*ptr);
  caf::scoped_actor self{sys};
  // Each hello names a node actor of its own, as a member may make any number of them.
  std::vector<caf::actor> fakes;
  std::optional<subprocess> node;
  uint32_t welcomed = 0;
  for (int i = 0; i < 5000; ++i) {
    fakes.push_back(sys.spawn([]() -> caf::behavior { return {[](caf::ok_atom) {}}; }));
    wire::hello h;
    h.roles = {wire::role::worker};
    h.node = "flood-" + std::to_string(i);
    h.slots = 4;
    self->request(cluster, 10s, h, caf::actor_cast<node_actor>(fakes.back()))
      .receive([&](const wire::welcome&) { ++welcomed; }, [](caf::error&) {});
    if (i == 2500) // a real node joins during the flood
      node.emplace(start({exe, "node", "--role", "worker", "--slots", "2", "--join", sched.join, "--name", "real-node"},
                         dir.file("node.log")));
  }
  CHECK(welcomed == 5000); // each replaces the one before it: no refusal, no growth
  CHECK(wait_for_file(dir.file("scheduler.log"),
                      [](const std::string& t) { return t.find("(real-node) joined") != std::string::npos; }, 30s));
  auto p = start({exe, "status", "--join", sched.join}, dir.file("status.log"));
  CHECK(p.wait(30) == 0);
  const auto status = slurp(dir.file("status.log"));
  const auto lines = std::count(status.begin(), status.end(), '\n');
  INFO(status.substr(0, 2000));
  CHECK(lines < 120); // the live nodes and the last 64 lost, not 5,000
  CHECK(status.find("flood-4999") != std::string::npos);
  CHECK(status.find("flood-10 ") == std::string::npos);
  CHECK(std::regex_search(status, std::regex{"real-node +worker +2 +alive"}));
  auto log = slurp(dir.file("scheduler.log"));
  CHECK(log.find("said hello over its connection (one connection is one node)") != std::string::npos);
  CHECK(log.find("its most") == std::string::npos);
  for (auto& f : fakes)
    caf::anon_send_exit(f, caf::exit_reason::user_shutdown);
  node->signal(SIGTERM);
  node->wait(20);
  sched.proc.signal(SIGTERM);
  CHECK(sched.proc.wait(20) == 0);
}
