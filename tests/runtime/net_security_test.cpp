// The token gate, the BASP frame guard, certificates and the TLS handshake, without a
// cluster: state machines fed bytes, and handshakes over socket pairs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <poll.h>
#include <netinet/in.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/core/clock.hpp"
#include "runtime/net/admitter.hpp"
#include "runtime/net/gate.hpp"
#include "runtime/net/handshake.hpp"
#include "runtime/net/http_endpoint.hpp"
#include "runtime/net/records.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/net/token_rules.hpp"
#include "runtime/os/memory.hpp"
#include "runtime/os/paths.hpp"
#include "runtime/os/threads.hpp"
#include "runtime/store/kv_store.hpp"
#include "temp_dir.hpp"

using namespace ashlar;
using namespace ashlar::net;
using ashlar::test::temp_dir;

namespace {

// Runs client and server state machines against each other, moving `chunk` bytes at a
// time. Returns every byte that crossed, for inspection.
std::vector<uint8_t> converse(gate_client& c, gate_server& s, size_t chunk = 1000) {
  std::vector<uint8_t> wire, to_server, to_client;
  for (int round = 0; round < 1000; ++round) {
    auto a = c.take_output();
    to_server.insert(to_server.end(), a.begin(), a.end());
    wire.insert(wire.end(), a.begin(), a.end());
    auto b = s.take_output();
    to_client.insert(to_client.end(), b.begin(), b.end());
    wire.insert(wire.end(), b.begin(), b.end());
    size_t n = std::min({chunk, to_server.size(), s.wants()});
    if (n > 0) {
      CHECK(s.feed(to_server.data(), n) == n);
      to_server.erase(to_server.begin(), to_server.begin() + static_cast<long>(n));
    }
    n = std::min({chunk, to_client.size(), c.wants()});
    if (n > 0) {
      CHECK(c.feed(to_client.data(), n) == n);
      to_client.erase(to_client.begin(), to_client.begin() + static_cast<long>(n));
    }
    if (c.state() != gate_state::running && s.state() != gate_state::running && to_client.empty()
        && to_server.empty())
      break;
    if (c.state() == gate_state::refused && to_client.empty())
      break;
  }
  return wire;
}

bool contains(const std::vector<uint8_t>& hay, const std::string& needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

std::array<uint8_t, 32> header_with_length(uint32_t len) {
  std::array<uint8_t, 32> h{};
  h[0] = 1; // operation
  h[4] = static_cast<uint8_t>(len >> 24);
  h[5] = static_cast<uint8_t>(len >> 16);
  h[6] = static_cast<uint8_t>(len >> 8);
  h[7] = static_cast<uint8_t>(len);
  return h;
}

} // namespace

TEST_CASE("the gate admits both sides that know the token, without the token crossing the wire") {
  const std::string token = "correct horse battery staple";
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{1000}}) {
    gate_client c{token};
    gate_server s{token};
    auto wire = converse(c, s, chunk);
    CHECK(c.state() == gate_state::admitted);
    CHECK(s.state() == gate_state::admitted);
    CHECK_FALSE(contains(wire, token));
    CHECK(wire.size() == 2 * gate_hello_bytes + gate_mac_bytes + gate_verdict_bytes);
  }
}

TEST_CASE("a recorded handshake does not admit a replay: each side's nonce is fresh") {
  gate_client c1{"t"};
  gate_server s1{"t"};
  auto first = converse(c1, s1);
  // Replay the recorded client bytes to a new server: its nonce differs, the proof fails.
  std::vector<uint8_t> client_bytes(first.begin(), first.begin() + gate_hello_bytes);
  client_bytes.insert(client_bytes.end(), first.begin() + 2 * gate_hello_bytes,
                      first.begin() + 2 * gate_hello_bytes + gate_mac_bytes);
  gate_server s2{"t"};
  s2.feed(client_bytes.data(), gate_hello_bytes);
  (void) s2.take_output();
  s2.feed(client_bytes.data() + gate_hello_bytes, gate_mac_bytes);
  CHECK(s2.state() == gate_state::refused);
  CHECK(s2.why() == "it did not prove it knows the cluster token");
}

namespace {

// What `w` seals from `data`, in records, as it would cross the wire.
std::vector<uint8_t> seal_all(record_writer& w, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> wire;
  for (size_t at = 0; at < data.size();) {
    size_t took = w.seal(data.data() + at, data.size() - at);
    REQUIRE(took > 0);
    at += took;
    size_t n = 0;
    const uint8_t* p = w.pending(n);
    wire.insert(wire.end(), p, p + n);
    w.sent(n);
  }
  return wire;
}

// Feeds `wire` to `r` `chunk` bytes at a time; the plaintext it gave until it broke.
std::vector<uint8_t> open_all(record_reader& r, const std::vector<uint8_t>& wire, size_t chunk, bool& ok) {
  std::vector<uint8_t> plain;
  ok = true;
  for (size_t at = 0; at < wire.size() && ok;) {
    size_t room = 0;
    uint8_t* into = r.space(room);
    size_t n = std::min({chunk, room, wire.size() - at});
    std::memcpy(into, wire.data() + at, n);
    at += n;
    ok = r.commit(n);
    size_t have = 0;
    while (ok && (ok = r.ready(have)) && have > 0) {
      std::vector<uint8_t> piece(std::min<size_t>(have, 3000));
      piece.resize(r.take(piece.data(), piece.size()));
      plain.insert(plain.end(), piece.begin(), piece.end());
    }
  }
  return plain;
}

} // namespace

TEST_CASE("both ends of an admitted handshake derive the same record keys, which differ per connection") {
  gate_client c{"t"};
  gate_server s{"t"};
  converse(c, s);
  REQUIRE(s.state() == gate_state::admitted);
  CHECK(std::memcmp(c.keys().client_tx, s.keys().client_tx, 32) == 0);
  CHECK(std::memcmp(c.keys().server_tx, s.keys().server_tx, 32) == 0);
  CHECK(std::memcmp(c.keys().client_tx, c.keys().server_tx, 32) != 0);
  gate_client c2{"t"};
  gate_server s2{"t"};
  converse(c2, s2);
  CHECK(std::memcmp(c.keys().client_tx, c2.keys().client_tx, 32) != 0);
}

TEST_CASE("sealed records carry bytes whole and unreadable, in any split, and refuse what was altered, "
          "replayed, reordered or sealed under another key") {
  uint8_t key[32] = {1, 2, 3};
  uint8_t other[32] = {9};
  std::vector<uint8_t> data(3 * max_record_bytes + 12345);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<uint8_t>(i * 7 + i / 1000);
  const std::string marker = "a readable marker";
  std::copy(marker.begin(), marker.end(), data.begin() + 100);
  record_writer w{key};
  auto wire = seal_all(w, data);
  const size_t records = (data.size() + write_record_bytes - 1) / write_record_bytes;
  CHECK(wire.size() == data.size() + records * (record_head_bytes + record_tag_bytes));
  CHECK_FALSE(contains(wire, marker));
  for (size_t chunk : {size_t{1} << 20, size_t{4096}, size_t{777}}) {
    record_reader r{key};
    bool ok = false;
    CHECK(open_all(r, wire, chunk, ok) == data);
    CHECK(ok);
  }
  SECTION("one flipped bit anywhere") {
    for (size_t at : {size_t{0}, size_t{5}, size_t{200}, write_record_bytes + 3, wire.size() - 1}) {
      auto bad = wire;
      bad[at] ^= 0x10;
      record_reader r{key};
      bool ok = true;
      auto plain = open_all(r, bad, 65536, ok);
      CHECK_FALSE(ok);
      CHECK(plain.size() < data.size());
      CHECK_FALSE(r.why().empty());
    }
  }
  SECTION("a record replayed, or two swapped") {
    const size_t rec = record_head_bytes + write_record_bytes + record_tag_bytes;
    auto replayed = wire;
    replayed.insert(replayed.begin() + rec, wire.begin(), wire.begin() + rec);
    auto swapped = wire;
    std::swap_ranges(swapped.begin(), swapped.begin() + rec, swapped.begin() + rec);
    for (auto* bad : {&replayed, &swapped}) {
      record_reader r{key};
      bool ok = true;
      auto plain = open_all(r, *bad, 65536, ok);
      CHECK_FALSE(ok);
      CHECK(plain.size() <= write_record_bytes);
      CHECK(r.why().find("failed authentication") != std::string::npos);
    }
  }
  SECTION("another key") {
    record_reader r{other};
    bool ok = true;
    CHECK(open_all(r, wire, 65536, ok).empty());
    CHECK_FALSE(ok);
  }
  SECTION("a length over the bound is refused before its bytes arrive") {
    std::vector<uint8_t> huge = {0x7f, 0xff, 0xff, 0xff, 1, 2, 3};
    record_reader r{key};
    bool ok = true;
    open_all(r, huge, 64, ok);
    CHECK_FALSE(ok);
    CHECK(r.why().find("at most") != std::string::npos);
  }
}

TEST_CASE("a sealed connection carries frames of any size whole, read piece by piece or in one, and keeps "
          "at most its fixed record buffers between messages") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  tcp_socket a{fds[0], "a"}, b{fds[1], "b"};
  uint8_t k1[32] = {1}, k2[32] = {2};
  a.seal(k1, k2);
  b.seal(k2, k1);
  std::vector<uint8_t> head(32, 7), meta(3 * 8, 9), payload(3 * write_record_bytes + 4000);
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<uint8_t>(i * 13 + i / 977);
  std::thread writer([&] {
    for (int round = 0; round < 3; ++round) {
      iovec iov[4] = {{head.data(), head.size()}, {nullptr, 0}, {meta.data(), meta.size()},
                      {payload.data(), payload.size()}};
      CHECK_FALSE(a.write_all(iov, 4));
    }
  });
  for (int round = 0; round < 2; ++round) { // as frames are read: header, metadata, payload
    std::vector<uint8_t> h(32), m(meta.size()), p(payload.size());
    REQUIRE_FALSE(b.read_exact(h.data(), h.size()));
    REQUIRE_FALSE(b.read_exact(m.data(), m.size()));
    REQUIRE_FALSE(b.read_exact(p.data(), p.size()));
    CHECK(h == head);
    CHECK(m == meta);
    CHECK(p == payload);
    CHECK(b.record_buffer_bytes() == 0); // every record opened where the caller wanted it
  }
  std::vector<uint8_t> all;
  for (size_t got = 0, want = head.size() + meta.size() + payload.size(); got < want;) {
    uint8_t piece[1000]; // in pieces smaller than a record
    const size_t n = std::min(sizeof piece, want - got);
    REQUIRE_FALSE(b.read_exact(piece, n));
    all.insert(all.end(), piece, piece + n);
    got += n;
  }
  writer.join();
  CHECK(std::equal(payload.begin(), payload.end(), all.begin() + 32 + 24));
  CHECK(a.record_buffer_bytes() <= seal_buffer_bytes);
  CHECK(b.record_buffer_bytes() <= seal_buffer_bytes);
}

TEST_CASE("a wrong token is refused on both sides, saying why") {
  gate_client c{"token-a"};
  gate_server s{"token-b"};
  converse(c, s);
  CHECK(s.state() == gate_state::refused);
  CHECK(s.why() == "it did not prove it knows the cluster token");
  CHECK(c.state() == gate_state::refused);
  CHECK(c.status() == gate_status::wrong_token);
  CHECK(c.why().find("expects another cluster token") != std::string::npos);

  gate_client none{""};
  gate_server guarded{"token"};
  converse(none, guarded);
  CHECK(guarded.state() == gate_state::refused);
  CHECK(none.state() == gate_state::refused);
}

TEST_CASE("a client refuses a server that cannot prove it knows the token") {
  gate_client c{"token"};
  std::vector<uint8_t> hello = c.take_output();
  REQUIRE(hello.size() == gate_hello_bytes);
  // A server that answers the challenge correctly shaped but cannot compute the proof.
  std::vector<uint8_t> challenge(gate_magic, gate_magic + 8);
  challenge.push_back(gate_version);
  challenge.push_back(0);
  challenge.resize(gate_hello_bytes, 0x42);
  c.feed(challenge.data(), challenge.size());
  (void) c.take_output();
  std::vector<uint8_t> verdict(gate_verdict_bytes, 0);
  c.feed(verdict.data(), verdict.size());
  CHECK(c.state() == gate_state::refused);
  CHECK(c.why().find("did not prove it knows the cluster token") != std::string::npos);
}

TEST_CASE("the gate refuses a peer that does not speak it, and another handshake version") {
  gate_server s{"t"};
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n..................";
  s.feed(reinterpret_cast<const uint8_t*>(junk), gate_hello_bytes);
  CHECK(s.state() == gate_state::refused);
  CHECK(s.why().find("not an Ashlar node") != std::string::npos);
  // One wrong byte is enough: no waiting for the rest of a hello that will not come.
  gate_server early{"t"};
  const uint8_t zero = 0;
  early.feed(&zero, 1);
  CHECK(early.state() == gate_state::refused);
  gate_server prefix{"t"};
  prefix.feed(reinterpret_cast<const uint8_t*>(gate_magic), 3);
  CHECK(prefix.state() == gate_state::running);

  gate_client c{"t"};
  auto hello = c.take_output();
  hello[8] = gate_version + 1;
  gate_server s2{"t"};
  s2.feed(hello.data(), hello.size());
  CHECK(s2.state() == gate_state::refused);
  CHECK(s2.why().find("handshake version") != std::string::npos);
  auto reply = s2.take_output();
  gate_client c2{"t"};
  (void) c2.take_output();
  c2.feed(reply.data(), reply.size());
  CHECK(c2.status() == gate_status::version_mismatch);
}

TEST_CASE("equal_secret compares every byte") {
  uint8_t a[32] = {}, b[32] = {};
  CHECK(equal_secret(a, b, 32));
  b[31] = 1;
  CHECK_FALSE(equal_secret(a, b, 32));
  b[31] = 0;
  b[0] = 1;
  CHECK_FALSE(equal_secret(a, b, 32));
}

TEST_CASE("the frame guard refuses a header announcing more than the limit, wherever the bytes split") {
  basp_frame_guard guard{1000};
  auto ok = header_with_length(1000);
  CHECK(guard.inspect(ok.data(), ok.size()));
  std::vector<uint8_t> payload(1000, 0xff); // payload bytes that look like a huge header
  CHECK(guard.inspect(payload.data(), 300));
  CHECK(guard.inspect(payload.data() + 300, 700));
  auto empty = header_with_length(0);
  CHECK(guard.inspect(empty.data(), empty.size()));
  auto huge = header_with_length(0xFFFFFFFFu);
  basp_frame_guard split{1000};
  CHECK(split.inspect(huge.data(), 5));
  CHECK_FALSE(split.inspect(huge.data() + 5, 27));
  CHECK(split.why().find("4294967295 bytes, more than the limit of 1000") != std::string::npos);
  CHECK_FALSE(guard.inspect(huge.data(), huge.size()));
}

namespace {

struct pki {
  temp_dir dir;
  std::string ca = dir.file("ca"), a = dir.file("a"), b = dir.file("b");
  pki() {
    REQUIRE(ensure_ca(ca).value());
    REQUIRE_FALSE(issue_node_cert(ca, a, "node-a", 30));
    REQUIRE_FALSE(issue_node_cert(ca, b, "node-b", 30));
  }
};

struct handshake_outcome {
  handshake::result client, server;
  std::string client_why, server_why, client_peer, server_peer;
};

handshake_outcome shake(const net_security& client_sec, const net_security& server_sec) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  for (int fd : sv)
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  handshake_outcome out;
  std::thread server{[&] {
    handshake h{sv[1], true, server_sec};
    out.server = run_handshake(h, std::chrono::seconds(5));
    out.server_why = h.why();
    out.server_peer = h.peer_name();
    ::shutdown(sv[1], SHUT_RDWR); // a refusing server closes
  }};
  handshake h{sv[0], false, client_sec};
  out.client = run_handshake(h, std::chrono::seconds(5));
  out.client_why = h.why();
  out.client_peer = h.peer_name();
  server.join();
  ::close(sv[0]);
  ::close(sv[1]);
  return out;
}

} // namespace

TEST_CASE("ashlar cert's CA and node certificates load, and a certificate from another CA does not verify") {
  pki p;
  auto a = tls_context::load(p.a);
  REQUIRE(a);
  CHECK((*a)->name() == "node-a");
  CHECK_FALSE(ensure_ca(p.ca).value()); // exists: kept
  temp_dir other;
  REQUIRE(ensure_ca(other.file("ca")).value());
  REQUIRE_FALSE(issue_node_cert(other.file("ca"), other.file("x"), "x", 30));
  // node.pem and key from another CA, ca.pem from ours.
  std::filesystem::copy_file(p.ca + "/ca.pem", other.file("x") + "/ca.pem",
                             std::filesystem::copy_options::overwrite_existing);
  auto x = tls_context::load(other.file("x"));
  REQUIRE_FALSE(x);
  CHECK(describe(x.error()).find("does not verify against") != std::string::npos);
  auto missing = tls_context::load(other.file("nothing"));
  REQUIRE_FALSE(missing);
  CHECK(describe(missing.error()).find("has no ca.pem") != std::string::npos);
}

TEST_CASE("mutual TLS and the gate admit two nodes of one CA, naming each other") {
  pki p;
  net_security a, b;
  a.tls = tls_context::load(p.a).value();
  b.tls = tls_context::load(p.b).value();
  a.token = b.token = "tok";
  auto r = shake(a, b);
  CHECK(r.client == handshake::result::admitted);
  CHECK(r.server == handshake::result::admitted);
  CHECK(r.client_peer == "node-b");
  CHECK(r.server_peer == "node-a");
}

TEST_CASE("TLS refuses a node of another CA, and a plain node reaching a TLS node learns it needs TLS") {
  pki p;
  temp_dir other;
  REQUIRE(ensure_ca(other.file("ca")).value());
  REQUIRE_FALSE(issue_node_cert(other.file("ca"), other.file("x"), "x", 30));
  net_security ours, theirs, plain;
  ours.tls = tls_context::load(p.a).value();
  theirs.tls = tls_context::load(other.file("x")).value();
  auto r = shake(theirs, ours);
  CHECK(r.client == handshake::result::refused);
  CHECK(r.server == handshake::result::refused);
  CHECK(r.server_why.find("TLS handshake failed") != std::string::npos);
  INFO(r.client_why);
  CHECK(r.client_why.find("TLS handshake failed") != std::string::npos);

  auto q = shake(plain, ours);
  CHECK(q.client == handshake::result::refused);
  CHECK(q.client_why.find("requires TLS") != std::string::npos);
  CHECK(q.server_why.find("does not use TLS") != std::string::npos);

  auto t = shake(ours, plain);
  CHECK(t.client == handshake::result::refused);
  CHECK(t.server_why.find("speaks TLS, this node does not") != std::string::npos);
}

TEST_CASE("a peer that connects and sends nothing is refused at the handshake deadline") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ::fcntl(sv[1], F_SETFL, ::fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  net_security sec;
  sec.token = "t";
  handshake h{sv[1], true, sec};
  auto t0 = std::chrono::steady_clock::now();
  CHECK(run_handshake(h, std::chrono::milliseconds(300)) == handshake::result::refused);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  CHECK(h.why().find("did not finish within 300 ms") != std::string::npos);
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST_CASE("confine_path keeps a requested path inside the work directory, through .. and symbolic links") {
  temp_dir dir;
  std::filesystem::create_directories(dir.file("work/sub"));
  const std::string work = dir.file("work");
  auto rel = confine_path(work, "sub/trace.json", "run.trace");
  REQUIRE(rel);
  CHECK(*rel == std::filesystem::weakly_canonical(work + "/sub/trace.json").string());
  CHECK(confine_path(work, work + "/ck", "run.checkpoint_dir"));
  CHECK(confine_path(work, "sub/../ok", "x"));
  auto up = confine_path(work, "../escape", "run.metrics");
  REQUIRE_FALSE(up);
  CHECK(describe(up.error()).find("run.metrics ../escape lies outside this node's work directory") != std::string::npos);
  CHECK_FALSE(confine_path(work, "/etc/passwd", "run.trace"));
  CHECK_FALSE(confine_path(work, dir.file("work-sibling/x"), "run.trace")); // a prefix is not a parent
  std::filesystem::create_directory_symlink(dir.path(), dir.file("work/link"));
  CHECK_FALSE(confine_path(work, "link/outside", "run.trace"));
}

TEST_CASE("a pinned checkpoint directory is made beneath the work directory, keeps naming itself when a "
          "symbolic link replaces it on the way, and is one pin per directory while held") {
  temp_dir dir;
  std::filesystem::create_directories(dir.file("work"));
  std::filesystem::create_directories(dir.file("outside"));
  const std::string work = dir.file("work");
  {
    auto pinned = pin_confined_dir(work, "jobs/ck", "run.checkpoint_dir");
    REQUIRE(pinned);
    auto pin = *pinned;
    CHECK(std::filesystem::is_directory(work + "/jobs/ck"));
    // The directory's name is swapped for a link out of the work directory after the pin:
    // what is written through the pin still lands in the directory that was pinned.
    std::filesystem::rename(work + "/jobs", work + "/jobs-moved");
    std::filesystem::create_directory_symlink(dir.file("outside"), work + "/jobs");
    {
      std::ofstream f{pin->path() + "/written"};
      f << "x";
    }
    CHECK(std::filesystem::exists(work + "/jobs-moved/ck/written"));
    CHECK_FALSE(std::filesystem::exists(dir.file("outside/ck/written")));
    CHECK_FALSE(std::filesystem::exists(dir.file("outside/written")));
    // Asked for again while held: the same pin, so one store opened twice in this process
    // is refused the second time, as by its name; messages name the directory as given.
    auto again = pin_confined_dir(work, "jobs/ck", "run.checkpoint_dir");
    REQUIRE(again);
    CHECK(again->get() == pin.get());
    auto first = open_rocksdb_store(pin->path() + "/s", open_mode::create, work + "/jobs/ck/s");
    REQUIRE(first);
    CHECK((*first)->where() == work + "/jobs/ck/s");
    auto second = open_rocksdb_store((*again)->path() + "/s", open_mode::create);
    REQUIRE_FALSE(second);
    CHECK(is(second.error(), errc::busy));
    const auto text = describe(pin->named(second.error(), work + "/jobs/ck"));
    CHECK(text.find(work + "/jobs/ck/s") != std::string::npos);
    CHECK(text.find("/proc/self/fd/") == std::string::npos);
  }
  // Pinned again once let go, the link on the way is refused, and so are .. and a path outside.
  auto again = pin_confined_dir(work, "jobs/ck", "run.checkpoint_dir");
  REQUIRE_FALSE(again);
  CHECK(describe(again.error()).find("run.checkpoint_dir jobs/ck: jobs on the way is not a directory")
        != std::string::npos);
  // A file opened at its use (a trace) goes through no link either.
  auto trace = open_confined(work, "jobs/trace.json", O_WRONLY | O_CREAT, "run.trace");
  REQUIRE_FALSE(trace);
  CHECK(describe(trace.error()).find("run.trace jobs/trace.json lies outside this node's work directory")
        != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("outside/trace.json")));
  CHECK_FALSE(pin_confined_dir(work, "../outside", "run.checkpoint_dir"));
  CHECK_FALSE(pin_confined_dir(work, dir.file("outside"), "run.checkpoint_dir"));
  CHECK_FALSE(std::filesystem::exists(dir.file("outside/ck")));
}

namespace {

int connect_local(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// A whole GET of `path`: the answer, or "" if none came within `limit`.
std::string http_get(uint16_t port, const std::string& path, std::chrono::milliseconds limit) {
  int fd = connect_local(port);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  (void) ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0)
      continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

} // namespace

TEST_CASE("/metrics answers within its deadline while ten clients trickle their requests a byte at a time and a "
          "hundred more hold connections open") {
  auto ep = http_endpoint::start("127.0.0.1", 0);
  REQUIRE(ep);
  (*ep)->publish("ashlar_up 1\n");
  std::vector<int> trickling;
  for (int i = 0; i < 10; ++i)
    trickling.push_back(connect_local((*ep)->port()));
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i)
    idle.push_back(connect_local((*ep)->port()));
  std::atomic<bool> stop{false};
  std::thread trickle{[&] {
    const std::string head = "GET /metrics HTTP/1.1\r\nHost: slow\r\n";
    for (size_t k = 0; !stop; k = (k + 1) % head.size()) {
      for (int fd : trickling)
        (void) ::send(fd, head.data() + k, 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
    }
  }};
  int answered = 0;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto answer = http_get((*ep)->port(), "/metrics", std::chrono::seconds(2));
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(answer.rfind("HTTP/1.1 200 OK", 0) == 0);
    CHECK(answer.find("ashlar_up 1") != std::string::npos);
    CHECK(took < std::chrono::milliseconds(500));
    answered += answer.find("ashlar_up 1") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  CHECK(answered == 10);
  // The tricklers were closed at their deadline (3 s for the whole request).
  int closed = 0;
  for (int fd : trickling) {
    char c;
    pollfd p{fd, POLLIN, 0};
    closed += ::poll(&p, 1, 0) == 1 && ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
  }
  CHECK(closed == 10);
  stop = true;
  trickle.join();
  for (int fd : trickling)
    ::close(fd);
  for (int fd : idle)
    ::close(fd);
  CHECK(http_get((*ep)->port(), "/nothing", std::chrono::seconds(2)).rfind("HTTP/1.1 404", 0) == 0);
}

TEST_CASE("a thread Ashlar starts carries its name, cut to the kernel's 15 characters") {
  std::string seen, cut;
  std::thread{[&] {
    char buf[32] = {};
    name_this_thread("ashlar.dp-serve");
    ::pthread_getname_np(::pthread_self(), buf, sizeof buf);
    seen = buf;
    name_this_thread("ashlar.a-name-too-long");
    ::pthread_getname_np(::pthread_self(), buf, sizeof buf);
    cut = buf;
  }}.join();
  CHECK(seen == "ashlar.dp-serve");
  CHECK(cut == "ashlar.a-name-t");
}

TEST_CASE("a host offers 64 worker slots a core and one per 32 MiB available, the smaller, at least one") {
  CHECK(host_slot_limit(2, 24ull << 30) == 128);
  CHECK(host_slot_limit(64, 2ull << 30) == 64);
  CHECK(host_slot_limit(0, 0) == 64);
  CHECK(host_slot_limit(8, 10ull << 20) == 1);
}

TEST_CASE("guards sharing a process budget refuse a big message past it, take small ones anyway, and give its bytes "
          "back when a message is whole or its connection goes") {
  auto budget = std::make_shared<inflight_budget>(uint64_t{5} << 20);
  auto a = std::make_unique<basp_frame_guard>(uint64_t{256} << 20, budget);
  basp_frame_guard b{uint64_t{256} << 20, budget};
  auto big = header_with_length(4u << 20);
  CHECK(a->inspect(big.data(), big.size()));
  CHECK(budget->used() == (4u << 20));
  CHECK_FALSE(b.inspect(big.data(), big.size()));
  CHECK(b.why().find("--max-in-flight-mb") != std::string::npos);
  basp_frame_guard c{uint64_t{256} << 20, budget};
  auto small = header_with_length(1000);
  CHECK(c.inspect(small.data(), small.size()));
  std::vector<uint8_t> payload(1000);
  CHECK(c.inspect(payload.data(), payload.size()));
  // a's message arrives whole: its bytes go back.
  std::vector<uint8_t> rest((4u << 20) - 1);
  CHECK(a->inspect(rest.data(), rest.size()));
  CHECK(budget->used() == (4u << 20));
  CHECK(a->inspect(rest.data(), 1));
  CHECK(budget->used() == 0);
  basp_frame_guard d{uint64_t{256} << 20, budget};
  CHECK(d.inspect(big.data(), big.size()));
  CHECK(budget->used() == (4u << 20));
  a.reset();
  d = basp_frame_guard{1 << 20};
  CHECK(budget->used() == 0);
}

TEST_CASE("a budget waited on takes its bytes when others give theirs back, not past the wait, and takes a "
          "message larger than itself only alone") {
  inflight_budget budget{1000};
  REQUIRE(budget.take(800));
  CHECK_FALSE(budget.take_within(300, std::chrono::milliseconds(50)));
  CHECK(budget.used() == 800);
  std::thread giver{[&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    budget.give(800);
  }};
  CHECK(budget.take_within(300, std::chrono::seconds(10)));
  giver.join();
  CHECK(budget.used() == 300);
  CHECK_FALSE(budget.take(5000)); // larger than the total: not beside another message
  budget.give(300);
  CHECK(budget.take(5000));
  CHECK_FALSE(budget.take(1));
  budget.give(5000);
  CHECK(budget.used() == 0);
  CHECK(message_deadline(uint64_t{256} << 20) == std::chrono::milliseconds(30000 + 256000));
}

TEST_CASE("a wait for room in the budget ends as soon as its connection ends, not at the wait's end") {
  inflight_budget budget{1000};
  REQUIRE(budget.take(800));
  std::atomic<bool> ended{false};
  std::thread ender{[&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ended = true;
    budget.wake();
  }};
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(budget.take_within(300, std::chrono::seconds(30), &ended));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  ender.join();
  CHECK(budget.used() == 800); // nothing taken
}

TEST_CASE("a big message that holds budget and stalls has its connection cut at its deadline, by the admitter's "
          "tick, and only then") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  auto budget = std::make_shared<inflight_budget>(uint64_t{64} << 20);
  basp_frame_guard g{uint64_t{256} << 20, budget};
  g.watch(fds[0], "10.0.0.9:4000");
  auto big = header_with_length(32u << 20);
  REQUIRE(g.inspect(big.data(), big.size()));
  CHECK(budget->used() == (32u << 20));
  CHECK(budget->cut_expired(steady_now()).empty()); // 30 s + 32 s from now
  auto cut = budget->cut_expired(steady_now() + std::chrono::seconds(63));
  REQUIRE(cut.size() == 1);
  CHECK(cut[0].find("10.0.0.9:4000") != std::string::npos);
  CHECK(cut[0].find("33554432 bytes") != std::string::npos);
  CHECK(budget->cut_expired(steady_now() + std::chrono::hours(1)).empty()); // once
  char c;
  CHECK(::recv(fds[1], &c, 1, 0) == 0); // the peer sees the connection end
  CHECK(budget->used() == (32u << 20)); // until its owner drops it
  g = basp_frame_guard{1 << 20};
  CHECK(budget->used() == 0);
  ::close(fds[0]);
  ::close(fds[1]);

  admitter a{net_security{}, "test"};
  std::atomic<int> ticks{0};
  a.on_tick([&] { ++ticks; });
  for (int i = 0; i < 300 && ticks < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(ticks >= 2); // one at once, the next within a second
  a.stop();
}

TEST_CASE("a cluster token under 128 bits is refused saying how to make one, a generated one passes") {
  CHECK(net::token_entropy_bits(std::string(64, 'a')) == 0); // one character repeated
  CHECK(net::token_entropy_bits("abcd") == 0);
  CHECK(net::token_entropy_bits("0123456789abcdef0123456789abcdef") == 128); // 32 hex: exactly 128
  CHECK(net::token_entropy_bits("0123456789abcdef0123456789abcde") < 128);
  CHECK(net::token_entropy_bits(net::random_hex(32)) == 256);
  CHECK_FALSE(net::check_token_strength(net::random_hex(32), "$ASHLAR_TOKEN"));
  CHECK_FALSE(net::check_token_strength("q2N8v1X0bY7rT4kP9sWzE3mH6cJ5aL1dF0gQ8uV2iO4=", "the token file t")); // base64 of 32 bytes
  auto err = net::check_token_strength("s3cr", "$ASHLAR_TOKEN");
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("$ASHLAR_TOKEN holds a token of at most 0 bits")
                              && Catch::Contains("head -c 32 /dev/urandom | base64"));
  err = net::check_token_strength("hetero-link-4242", "the token file t");
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("at most 96 bits"));
}

TEST_CASE("a token file others may read is refused as a key would be, naming the chmod") {
  temp_dir dir;
  const auto file = dir.file("token");
  { std::ofstream{file} << net::random_hex(32) << "\n"; }
  ::chmod(file.c_str(), 0644);
  auto err = net::check_token_file(file);
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("mode 0644") && Catch::Contains("chmod 600 " + file));
  ::chmod(file.c_str(), 0600);
  CHECK_FALSE(net::check_token_file(file));
  // A link to a private file (a Kubernetes Secret's file is one) is followed.
  const auto link = dir.file("link");
  REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);
  CHECK_FALSE(net::check_token_file(link));
  CHECK(net::check_token_file(dir.path())); // not a regular file
}

TEST_CASE("a directory for tokens that others may write, that is a link, or that another user made is refused") {
  temp_dir dir;
  const auto mine = dir.file("mine");
  REQUIRE(::mkdir(mine.c_str(), 0700) == 0);
  CHECK_FALSE(net::check_private_dir(mine, "the cluster token's directory"));
  const auto open_dir = dir.file("open");
  REQUIRE(::mkdir(open_dir.c_str(), 0700) == 0);
  ::chmod(open_dir.c_str(), 0777); // as a directory planted in /tmp for others to fill
  auto err = net::check_private_dir(open_dir, "the cluster token's directory");
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("may be written by others (mode 0777)") && Catch::Contains("ASHLAR_HOME"));
  const auto link = dir.file("link");
  REQUIRE(::symlink(mine.c_str(), link.c_str()) == 0);
  CHECK(net::check_private_dir(link, "the cluster token's directory"));
  if (::getuid() == 0) { // another user's directory (root can make one; CI runs as root)
    const auto theirs = dir.file("theirs");
    REQUIRE(::mkdir(theirs.c_str(), 0700) == 0);
    REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
    err = net::check_private_dir(theirs, "the cluster token's directory");
    REQUIRE(err);
    CHECK_THAT(describe(err), Catch::Contains("belongs to user 65534, not to you"));
  }
}
