// The gate every connection to an Ashlar node passes before any message is read:
// a mutual challenge-response on the cluster token (HMAC-SHA256 over fresh nonces from
// both sides, so the token never crosses the wire, and a recorded handshake is worthless
// later), and a bound on the size of every message an admitted peer announces.
//
//   client -> server  hello      "ASHLGATE" version(1) flags(1) nonce_c(32)        42 bytes
//   server -> client  challenge  "ASHLGATE" version(1) status(1) nonce_s(32)       42 bytes
//   client -> server  proof      HMAC(token, "ashlar client" | nonce_c | nonce_s)  32 bytes
//   server -> client  verdict    status(1) HMAC(token, "ashlar server" | nonce_s | nonce_c)
//
// After the verdict, a connection without TLS carries only sealed records (records.hpp)
// under keys both ends derive from the token and both nonces (session_keys): a peer that
// passed someone else's handshake through cannot write a byte the other end accepts.
//
// A refused peer gets a status byte saying why (wrong token, protocol version, TLS
// needed) and the connection is closed. The state machines below only transform bytes;
// runtime/net/handshake.hpp drives them over sockets.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <map>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

namespace ashlar::net {

constexpr size_t gate_nonce_bytes = 32;
constexpr size_t gate_mac_bytes = 32;
constexpr uint8_t gate_version = 2; // 2: sealed records after the verdict
/// "ASHLGATE": the first eight bytes a client sends.
constexpr char gate_magic[8] = {'A', 'S', 'H', 'L', 'G', 'A', 'T', 'E'};
constexpr size_t gate_hello_bytes = 8 + 1 + 1 + gate_nonce_bytes;
constexpr size_t gate_verdict_bytes = 1 + gate_mac_bytes;

enum class gate_status : uint8_t {
  ok = 0,
  wrong_token = 1,
  version_mismatch = 2,
  needs_tls = 3,
};

/// A user-facing reason for a status a server sent.
std::string to_string(gate_status s);

using gate_nonce = std::array<uint8_t, gate_nonce_bytes>;

/// A fresh random nonce (OpenSSL's CSPRNG).
gate_nonce random_nonce();

/// `bytes` random bytes from the same generator, as lowercase hex (tokens, job keys).
std::string random_hex(size_t bytes);

/// HMAC-SHA256(key, label | a | b).
std::array<uint8_t, gate_mac_bytes> gate_mac(const std::string& key, const char* label, const gate_nonce& a,
                                             const gate_nonce& b);

/// Constant-time equality of two byte ranges of the same length.
bool equal_secret(const uint8_t* a, const uint8_t* b, size_t n);

/// The record keys of one admitted connection, one per direction.
struct session_keys {
  uint8_t client_tx[32] = {};
  uint8_t server_tx[32] = {};
};

/// HMAC-SHA256(token, label | nonce_c | nonce_s) for each direction's label.
session_keys derive_session_keys(const std::string& token, const gate_nonce& nonce_c, const gate_nonce& nonce_s);

/// Where a handshake stands.
enum class gate_state { running, admitted, refused };

/// The server's side. Feed it what the peer sent; send what take_output() returns.
class gate_server {
public:
  explicit gate_server(std::string token, gate_nonce nonce = random_nonce());
  /// Admits a peer that proves any one of `tokens` (a data port serving several jobs).
  explicit gate_server(std::vector<std::string> tokens, gate_nonce nonce = random_nonce());

  /// Consumes up to n bytes (never more than wants()); returns how many it took.
  size_t feed(const uint8_t* data, size_t n);
  /// Bytes the server still needs before it can go on (0 when done).
  size_t wants() const;
  /// Bytes to send to the peer (cleared by the call).
  std::vector<uint8_t> take_output();
  gate_state state() const { return state_; }
  /// Why the peer was refused (for the server's log).
  const std::string& why() const { return why_; }
  /// The token the admitted peer proved.
  const std::string& matched() const { return tokens_[matched_]; }
  /// The record keys, once admitted.
  session_keys keys() const { return derive_session_keys(tokens_[matched_], nonce_c_, nonce_s_); }

  /// Sends a challenge with status needs_tls (for a plain client that reached a TLS port).
  static std::vector<uint8_t> needs_tls_reply();

private:
  std::vector<std::string> tokens_;
  size_t matched_ = 0;
  gate_nonce nonce_s_{};
  gate_nonce nonce_c_{};
  std::vector<uint8_t> in_;
  std::vector<uint8_t> out_;
  int step_ = 0; // 0: want hello, 1: want proof
  gate_state state_ = gate_state::running;
  std::string why_;
};

/// The client's side. Its first output is the hello.
class gate_client {
public:
  explicit gate_client(std::string token, gate_nonce nonce = random_nonce());

  size_t feed(const uint8_t* data, size_t n);
  size_t wants() const;
  std::vector<uint8_t> take_output();
  gate_state state() const { return state_; }
  /// Why the server refused, or why the client refuses the server (a server that does not
  /// know the token), for the user.
  const std::string& why() const { return why_; }
  /// The status the server sent (ok unless it refused).
  gate_status status() const { return status_; }
  /// The record keys, once admitted.
  session_keys keys() const { return derive_session_keys(token_, nonce_c_, nonce_s_); }

private:
  std::string token_;
  gate_nonce nonce_c_{};
  gate_nonce nonce_s_{};
  std::vector<uint8_t> in_;
  std::vector<uint8_t> out_;
  int step_ = 0; // 0: want challenge, 1: want verdict
  gate_state state_ = gate_state::running;
  gate_status status_ = gate_status::ok;
  std::string why_;
};

/// Messages up to this size are not counted against an inflight_budget: 2 MiB.
constexpr uint64_t unbudgeted_message_bytes = uint64_t{2} << 20;

/// The bytes of messages a process is receiving (announced, their buffers allocated, not
/// yet whole or not yet applied), across all its connections, against a total.
/// Thread-safe. A message larger than the total is taken only while nothing else is.
class inflight_budget {
public:
  explicit inflight_budget(uint64_t total) : total_(total) {}
  /// Takes n bytes; false (nothing taken) if that would pass the total.
  bool take(uint64_t n);
  /// Takes n bytes, waiting up to `wait` for others to give theirs back; false (nothing
  /// taken) if they did not in time, or once `*cancel` is true (the caller's connection
  /// ended: whoever sets it calls wake()).
  bool take_within(uint64_t n, std::chrono::milliseconds wait, const std::atomic<bool>* cancel = nullptr);
  /// Wakes every take_within, to look at its `cancel` again.
  void wake();
  void give(uint64_t n);
  uint64_t total() const { return total_; }
  uint64_t used() const;

  /// Takes n bytes (as take()) for a message on connection `fd` that must arrive whole by
  /// `deadline`; returns the hold's id (0: nothing taken). The budget keeps its own
  /// descriptor of the connection until give_held().
  uint64_t take_held(uint64_t n, std::chrono::steady_clock::time_point deadline, int fd, const std::string& peer);
  /// Gives a hold's bytes back (0: none).
  void give_held(uint64_t id);
  /// Shuts down (both directions, once) the connection of every hold whose deadline is
  /// before `now`, so that its owner sees it end and gives the bytes back; says which.
  std::vector<std::string> cut_expired(std::chrono::steady_clock::time_point now);

private:
  struct hold {
    uint64_t bytes;
    std::chrono::steady_clock::time_point deadline;
    int fd; // a dup of the connection's, so never another connection's number; -1 once cut
    std::string peer;
  };
  bool fits(uint64_t n) const { return used_ + n <= total_ || used_ == 0; }
  mutable std::mutex mtx_;
  std::condition_variable freed_;
  uint64_t used_ = 0;
  uint64_t total_;
  uint64_t next_hold_ = 1;
  std::map<uint64_t, hold> holds_;
};

/// How long a message over unbudgeted_message_bytes may wait for room in a budget, and
/// then take to arrive whole: `grace` plus a second a MiB (a link of 1 MB/s still
/// delivers; a peer that trickles slower is closed and its bytes given back).
inline std::chrono::milliseconds message_deadline(uint64_t bytes,
                                                  std::chrono::milliseconds grace = std::chrono::seconds(30)) {
  return grace + std::chrono::milliseconds((bytes >> 20) * 1000);
}

/// Watches the byte stream of CAF's BASP protocol as it is read (32-byte headers, each
/// followed by its payload_len bytes) and refuses a header announcing more than `limit`
/// payload bytes, or (beyond unbudgeted_message_bytes) more than `budget` has left for the
/// whole process, before the receiver allocates the buffer for it. A message's bytes stay taken from the budget
/// until it is whole (or the connection closes).
class basp_frame_guard {
public:
  static constexpr size_t header_bytes = 32;
  static constexpr size_t length_offset = 4; // uint32, big-endian

  explicit basp_frame_guard(uint64_t limit, std::shared_ptr<inflight_budget> budget = nullptr)
    : limit_(limit), budget_(std::move(budget)) {}
  ~basp_frame_guard() { release(); }
  basp_frame_guard(const basp_frame_guard&) = delete;
  basp_frame_guard& operator=(const basp_frame_guard&) = delete;
  basp_frame_guard& operator=(basp_frame_guard&& other) noexcept;

  /// The connection a budgeted message holds its bytes for, cut if the message does not
  /// arrive whole within message_deadline() (inflight_budget::cut_expired).
  void watch(int fd, std::string peer) {
    fd_ = fd;
    peer_ = std::move(peer);
  }

  /// Inspects the next n bytes of the stream; false if they complete a header over the
  /// limit (why() says which size).
  bool inspect(const uint8_t* data, size_t n);
  const std::string& why() const { return why_; }
  uint64_t limit() const { return limit_; }

private:
  void release();

  uint64_t limit_;
  std::shared_ptr<inflight_budget> budget_;
  uint64_t reserved_ = 0; // the hold in budget_ of the message being received (0: none)
  int fd_ = -1;
  std::string peer_;
  uint64_t payload_left_ = 0;
  uint8_t header_[header_bytes] = {};
  size_t header_have_ = 0;
  std::string why_;
};

}  // namespace ashlar::net
