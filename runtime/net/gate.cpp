#include "runtime/net/gate.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/core/clock.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace ashlar::net {

std::string to_string(gate_status s) {
  switch (s) {
    case gate_status::ok:
      return "accepted";
    case gate_status::wrong_token:
      return "it expects another cluster token (check --token-file / ASHLAR_TOKEN on both sides)";
    case gate_status::version_mismatch:
      return "it speaks another version of Ashlar's connection handshake";
    case gate_status::needs_tls:
      return "it requires TLS (give this command --tls DIR with a certificate from the cluster's CA; see "
             "`ashlar cert`)";
  }
  return "unknown status " + std::to_string(static_cast<int>(s));
}

gate_nonce random_nonce() {
  gate_nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    std::abort(); // no entropy: nothing secure can be done
  return n;
}

std::string random_hex(size_t bytes) {
  std::vector<uint8_t> raw(bytes);
  if (RAND_bytes(raw.data(), static_cast<int>(raw.size())) != 1)
    std::abort();
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t c : raw) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::array<uint8_t, gate_mac_bytes> gate_mac(const std::string& key, const char* label, const gate_nonce& a,
                                             const gate_nonce& b) {
  std::vector<uint8_t> msg(label, label + std::strlen(label));
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  std::array<uint8_t, gate_mac_bytes> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(), out.data(), &len);
  return out;
}

session_keys derive_session_keys(const std::string& token, const gate_nonce& nonce_c, const gate_nonce& nonce_s) {
  session_keys k;
  auto c = gate_mac(token, "ashlar records client to server", nonce_c, nonce_s);
  auto s = gate_mac(token, "ashlar records server to client", nonce_c, nonce_s);
  std::copy(c.begin(), c.end(), k.client_tx);
  std::copy(s.begin(), s.end(), k.server_tx);
  return k;
}

bool equal_secret(const uint8_t* a, const uint8_t* b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

namespace {

const char client_label[] = "ashlar client";
const char server_label[] = "ashlar server";

void put_magic(std::vector<uint8_t>& out, uint8_t byte9, const gate_nonce& nonce) {
  out.insert(out.end(), gate_magic, gate_magic + sizeof gate_magic);
  out.push_back(gate_version);
  out.push_back(byte9);
  out.insert(out.end(), nonce.begin(), nonce.end());
}

// Moves bytes into `in` until it holds `need`; returns how many were taken.
size_t collect(std::vector<uint8_t>& in, size_t need, const uint8_t* data, size_t n) {
  size_t take = std::min(n, need > in.size() ? need - in.size() : 0);
  in.insert(in.end(), data, data + take);
  return take;
}

} // namespace

gate_server::gate_server(std::string token, gate_nonce nonce)
  : gate_server(std::vector<std::string>{std::move(token)}, nonce) {
}

gate_server::gate_server(std::vector<std::string> tokens, gate_nonce nonce)
  : tokens_(std::move(tokens)), nonce_s_(nonce) {
}

std::vector<uint8_t> gate_server::needs_tls_reply() {
  std::vector<uint8_t> out;
  put_magic(out, static_cast<uint8_t>(gate_status::needs_tls), gate_nonce{});
  return out;
}

size_t gate_server::wants() const {
  if (state_ != gate_state::running)
    return 0;
  size_t need = step_ == 0 ? gate_hello_bytes : gate_mac_bytes;
  return need - in_.size();
}

size_t gate_server::feed(const uint8_t* data, size_t n) {
  if (state_ != gate_state::running)
    return 0;
  size_t used = collect(in_, step_ == 0 ? gate_hello_bytes : gate_mac_bytes, data, n);
  // A peer whose first bytes are not the magic is refused at once, not at the deadline.
  const bool bad_magic =
    step_ == 0 && std::memcmp(in_.data(), gate_magic, std::min(in_.size(), sizeof gate_magic)) != 0;
  if (wants() > 0 && !bad_magic)
    return used;
  if (step_ == 0) {
    if (bad_magic) {
      state_ = gate_state::refused;
      why_ = "it is not an Ashlar node (the connection did not start with Ashlar's handshake)";
      return used;
    }
    if (in_[8] != gate_version) {
      put_magic(out_, static_cast<uint8_t>(gate_status::version_mismatch), gate_nonce{});
      state_ = gate_state::refused;
      why_ = "handshake version " + std::to_string(in_[8]) + ", this node speaks " + std::to_string(gate_version);
      return used;
    }
    std::copy(in_.begin() + 10, in_.begin() + 10 + gate_nonce_bytes, nonce_c_.begin());
    put_magic(out_, static_cast<uint8_t>(gate_status::ok), nonce_s_);
    in_.clear();
    step_ = 1;
    return used;
  }
  // Every token is tried (in constant time each), so the time taken says nothing of which.
  bool found = false;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    auto expect = gate_mac(tokens_[i], client_label, nonce_c_, nonce_s_);
    if (equal_secret(expect.data(), in_.data(), gate_mac_bytes) && !found) {
      found = true;
      matched_ = i;
    }
  }
  if (!found) {
    out_.push_back(static_cast<uint8_t>(gate_status::wrong_token));
    out_.insert(out_.end(), gate_mac_bytes, 0);
    state_ = gate_state::refused;
    why_ = tokens_.size() == 1 && tokens_[0].empty() ? "it presented a cluster token, this node has none"
                                                     : "it did not prove it knows the cluster token";
    return used;
  }
  out_.push_back(static_cast<uint8_t>(gate_status::ok));
  auto proof = gate_mac(tokens_[matched_], server_label, nonce_s_, nonce_c_);
  out_.insert(out_.end(), proof.begin(), proof.end());
  state_ = gate_state::admitted;
  return used;
}

std::vector<uint8_t> gate_server::take_output() {
  return std::exchange(out_, {});
}

gate_client::gate_client(std::string token, gate_nonce nonce) : token_(std::move(token)), nonce_c_(nonce) {
  put_magic(out_, 0, nonce_c_);
}

size_t gate_client::wants() const {
  if (state_ != gate_state::running)
    return 0;
  size_t need = step_ == 0 ? gate_hello_bytes : gate_verdict_bytes;
  return need - in_.size();
}

size_t gate_client::feed(const uint8_t* data, size_t n) {
  if (state_ != gate_state::running)
    return 0;
  size_t used = collect(in_, step_ == 0 ? gate_hello_bytes : gate_verdict_bytes, data, n);
  if (wants() > 0)
    return used;
  if (step_ == 0) {
    if (std::memcmp(in_.data(), gate_magic, sizeof gate_magic) != 0) {
      state_ = gate_state::refused;
      why_ = "the peer is not an Ashlar node (its answer did not follow Ashlar's handshake)";
      return used;
    }
    status_ = static_cast<gate_status>(in_[9]);
    if (status_ != gate_status::ok) {
      state_ = gate_state::refused;
      why_ = "the node refused the connection: " + to_string(status_);
      return used;
    }
    std::copy(in_.begin() + 10, in_.begin() + 10 + gate_nonce_bytes, nonce_s_.begin());
    auto proof = gate_mac(token_, client_label, nonce_c_, nonce_s_);
    out_.insert(out_.end(), proof.begin(), proof.end());
    in_.clear();
    step_ = 1;
    return used;
  }
  status_ = static_cast<gate_status>(in_[0]);
  if (status_ != gate_status::ok) {
    state_ = gate_state::refused;
    why_ = "the node refused the connection: " + to_string(status_);
    return used;
  }
  auto expect = gate_mac(token_, server_label, nonce_s_, nonce_c_);
  if (!equal_secret(expect.data(), in_.data() + 1, gate_mac_bytes)) {
    state_ = gate_state::refused;
    why_ = "the node did not prove it knows the cluster token (another cluster, or a node posing as one)";
    return used;
  }
  state_ = gate_state::admitted;
  return used;
}

std::vector<uint8_t> gate_client::take_output() {
  return std::exchange(out_, {});
}

bool inflight_budget::take(uint64_t n) {
  std::lock_guard<std::mutex> lock{mtx_};
  if (!fits(n))
    return false;
  used_ += n;
  return true;
}

bool inflight_budget::take_within(uint64_t n, std::chrono::milliseconds wait, const std::atomic<bool>* cancel) {
  std::unique_lock<std::mutex> lock{mtx_};
  auto cancelled = [&] { return cancel != nullptr && cancel->load(); };
  if (!freed_.wait_for(lock, wait, [&] { return fits(n) || cancelled(); }) || cancelled())
    return false;
  used_ += n;
  return true;
}

void inflight_budget::wake() {
  std::lock_guard<std::mutex> lock{mtx_}; // a waiter between its look and its wait is not missed
  freed_.notify_all();
}

void inflight_budget::give(uint64_t n) {
  {
    std::lock_guard<std::mutex> lock{mtx_};
    used_ -= std::min(n, used_);
  }
  freed_.notify_all();
}

uint64_t inflight_budget::used() const {
  std::lock_guard<std::mutex> lock{mtx_};
  return used_;
}

uint64_t inflight_budget::take_held(uint64_t n, std::chrono::steady_clock::time_point deadline, int fd,
                                   const std::string& peer) {
  std::lock_guard<std::mutex> lock{mtx_};
  if (!fits(n))
    return 0;
  used_ += n;
  const uint64_t id = next_hold_++;
  holds_.emplace(id, hold{n, deadline, fd >= 0 ? ::fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1, peer});
  return id;
}

void inflight_budget::give_held(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock{mtx_};
    auto it = holds_.find(id);
    if (it == holds_.end())
      return;
    used_ -= std::min(it->second.bytes, used_);
    if (it->second.fd >= 0)
      ::close(it->second.fd);
    holds_.erase(it);
  }
  freed_.notify_all();
}

std::vector<std::string> inflight_budget::cut_expired(std::chrono::steady_clock::time_point now) {
  std::vector<std::string> cut;
  std::lock_guard<std::mutex> lock{mtx_};
  for (auto& [id, h] : holds_) {
    if (h.fd < 0 || now < h.deadline)
      continue;
    ::shutdown(h.fd, SHUT_RDWR);
    ::close(h.fd);
    h.fd = -1;
    cut.push_back(h.peer + ": a message of " + std::to_string(h.bytes) + " bytes did not arrive whole by its "
                  "deadline (30 s and a second a MiB), its connection is closed");
  }
  return cut;
}

basp_frame_guard& basp_frame_guard::operator=(basp_frame_guard&& other) noexcept {
  release();
  limit_ = other.limit_;
  budget_ = std::move(other.budget_);
  reserved_ = std::exchange(other.reserved_, 0);
  fd_ = std::exchange(other.fd_, -1);
  peer_ = std::move(other.peer_);
  payload_left_ = std::exchange(other.payload_left_, 0);
  std::memcpy(header_, other.header_, header_bytes);
  header_have_ = std::exchange(other.header_have_, 0);
  why_ = std::move(other.why_);
  return *this;
}

void basp_frame_guard::release() {
  if (budget_ && reserved_ > 0)
    budget_->give_held(reserved_);
  reserved_ = 0;
}

bool basp_frame_guard::inspect(const uint8_t* data, size_t n) {
  while (n > 0) {
    if (payload_left_ > 0) {
      auto skip = static_cast<size_t>(std::min<uint64_t>(payload_left_, n));
      payload_left_ -= skip;
      data += skip;
      n -= skip;
      if (payload_left_ == 0)
        release(); // whole: the receiver hands it on
      continue;
    }
    size_t take = std::min(n, header_bytes - header_have_);
    std::memcpy(header_ + header_have_, data, take);
    header_have_ += take;
    data += take;
    n -= take;
    if (header_have_ < header_bytes)
      continue;
    header_have_ = 0;
    const uint8_t* p = header_ + length_offset;
    uint64_t len = (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) | uint64_t{p[3]};
    if (len > limit_) {
      why_ = "it announced a message of " + std::to_string(len) + " bytes, more than the limit of "
             + std::to_string(limit_) + " (--max-message-mb)";
      return false;
    }
    // Small messages (control, 1 MiB chunks) stay out of the budget: each connection holds
    // at most one, and a budget taken by big ones must not starve them.
    const bool budgeted = budget_ && len > unbudgeted_message_bytes;
    const uint64_t held = budgeted ? budget_->take_held(len, steady_now() + message_deadline(len), fd_, peer_) : 0;
    if (budgeted && held == 0) {
      why_ = "it announced a message of " + std::to_string(len) + " bytes while messages of "
             + std::to_string(budget_->used()) + " bytes were being received; the process takes at most "
             + std::to_string(budget_->total()) + " in flight (--max-in-flight-mb)";
      return false;
    }
    reserved_ = held;
    payload_left_ = len;
  }
  return true;
}

}  // namespace ashlar::net
