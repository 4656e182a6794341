#include "runtime/net/shm_channel.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "runtime/core/clock.hpp"
#include "runtime/net/gate.hpp"
#include "runtime/net/socket.hpp"
#include "runtime/net/tensor_frames.hpp"

#include <spdlog/spdlog.h>

namespace ashlar::net {

namespace {

// A piece's head in the ring: its length (the top bit says lent) and, if lent, where the
// buffer is in the writer's memory.
struct piece_head {
  uint64_t length = 0;
  uint64_t address = 0;
};
constexpr uint64_t lent_bit = uint64_t{1} << 63;
// A lent piece in the writer's arena, leased: the peer may read it in place. Its length
// word then holds the lease's slot (bits 48-55) and generation (32-47) above a length of
// less than 4 GiB.
constexpr uint64_t leased_bit = uint64_t{1} << 62;
constexpr uint64_t max_leased_bytes = uint64_t{1} << 32;

// The proof each end writes raw into its ring before the switch: the nonce and the
// address of this process's own copy of it.
constexpr size_t nonce_chars = 32;
struct proof {
  char nonce[nonce_chars];
  uint64_t address;
  // The writer's arena for the job (shm_arena): its descriptor in the writer's process
  // (-1: none), where the writer maps it, and its size.
  int64_t arena_fd;
  uint64_t arena_base;
  uint64_t arena_size;
};

std::string errno_text(int e) {
  return std::strerror(e);
}

caf::error unreachable(const std::string& peer, const std::string& what) {
  return make_error(errc::peer_unreachable, "shared-memory channel with " + peer + ": " + what);
}

sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  addr.sun_path[0] = '\0'; // abstract: no file, per network namespace
  std::memcpy(addr.sun_path + 1, name.data(), std::min(name.size(), sizeof addr.sun_path - 2));
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

bool is_hex(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

// The kernel's word on who is at the other end of a Unix-domain socket.
expected<ucred> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return make_error(errc::io_error, "SO_PEERCRED: " + errno_text(errno));
  if (cred.uid != ::geteuid())
    return make_error(errc::handshake_refused, "the peer runs as another user (uid " + std::to_string(cred.uid) + ")");
  if (cred.pid <= 0)
    return make_error(errc::handshake_refused, "the peer's process is not visible from here (another pid namespace)");
  return cred;
}

// One byte of data carrying two descriptors (SCM_RIGHTS): the message both ends of the
// offer's connection use.
struct rights_message {
  char byte = 'S';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  rights_message() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  rights_message(const rights_message&) = delete;
  rights_message& operator=(const rights_message&) = delete;
};

// Client: accepts one connection on the offer and takes the two descriptors it carries.
caf::error receive_segments(shm_offer& offer, std::chrono::milliseconds timeout, int (&fds)[2], int& pid) {
  pollfd p{offer.fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1)
    return make_error(errc::peer_unreachable, "no shared-memory segments came within "
                                                + std::to_string(timeout.count()) + " ms");
  int conn = ::accept4(offer.fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (conn < 0)
    return make_error(errc::io_error, "accept on the shared-memory offer: " + errno_text(errno));
  auto cred = peer_credentials(conn);
  rights_message m;
  msghdr& msg = m.msg;
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const ssize_t got = cred ? ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC) : -1;
  ::close(conn);
  if (!cred)
    return cred.error();
  cmsghdr* c = got == 1 ? CMSG_FIRSTHDR(&msg) : nullptr;
  if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS
      || c->cmsg_len != CMSG_LEN(2 * sizeof(int)) || (msg.msg_flags & MSG_CTRUNC) != 0) {
    // Whatever came is closed: nothing of it is used.
    if (c != nullptr && c->cmsg_type == SCM_RIGHTS)
      for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i)
        ::close(reinterpret_cast<int*>(CMSG_DATA(c))[i]);
    return make_error(errc::malformed_message, "the shared-memory offer received no pair of segments");
  }
  std::memcpy(fds, CMSG_DATA(c), sizeof fds);
  pid = cred->pid;
  return {};
}

// Server: connects to the client's offer (before any segment is made: a client on
// another host costs nothing more); the kernel names the process at the other end.
expected<int> connect_offer(const std::string& name, int& pid) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return make_error(errc::io_error, "socket(AF_UNIX): " + errno_text(errno));
  socklen_t len = 0;
  auto addr = abstract_address(name, len);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int e = errno;
    ::close(fd);
    return make_error(errc::peer_unreachable, "the peer's offer is not reachable from here (" + errno_text(e)
                                                + "): not on this host, or in another network namespace");
  }
  auto cred = peer_credentials(fd);
  if (!cred) {
    ::close(fd);
    return cred.error();
  }
  pid = cred->pid;
  return fd;
}

// Server: passes the two descriptors over the offer's connection, and closes it.
caf::error pass_segments(int fd, int a, int b) {
  rights_message m;
  msghdr& msg = m.msg;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {a, b};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  const ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  const int e = errno;
  ::close(fd);
  if (sent != 1)
    return make_error(errc::io_error, "passing the shared-memory segments: " + errno_text(e));
  return {};
}

// Reads the peer's proof from `ring` and checks it: the nonce sent over TCP, and the same
// nonce read out of the peer's memory.
caf::error check_proof(shm_ring& ring, const std::string& nonce, int pid, std::chrono::milliseconds timeout,
                       std::shared_ptr<peer_arena>& arena) {
  proof p{};
  if (auto err = ring.read_exact(&p, sizeof p, timeout))
    return err;
  arena = nullptr;
  if (nonce.size() != nonce_chars || std::memcmp(p.nonce, nonce.data(), nonce_chars) != 0)
    return make_error(errc::handshake_refused, "the segments do not carry this connection's nonce "
                                                 "(they were not made by this connection's peer)");
  char theirs[nonce_chars];
  if (auto err = read_peer_memory(pid, p.address, theirs, sizeof theirs))
    return make_error(errc::handshake_refused, "cannot read the peer's memory (" + describe(err)
                                                 + "): another user, a ptrace policy or a seccomp filter");
  if (std::memcmp(theirs, nonce.data(), nonce_chars) != 0)
    return make_error(errc::handshake_refused, "the peer's copy of the nonce differs (another process?)");
  // The peer proved who it is: its arena, if it offers one, is mapped read-only. Where
  // that fails (a seccomp filter on pidfd_getfd, ...) its tensors are copied as before.
  if (p.arena_fd >= 0 && p.arena_fd <= INT32_MAX) {
    if (auto m = map_peer_arena(pid, static_cast<int>(p.arena_fd), p.arena_base, static_cast<size_t>(p.arena_size)))
      arena = std::move(*m);
    else
      spdlog::info("shared-memory channel: {}; tensors from that peer are copied", describe(m.error()));
  }
  return {};
}

caf::error write_proof(shm_ring& ring, const std::string& nonce, std::chrono::milliseconds timeout,
                       const shm_arena* arena) {
  proof p{};
  std::memcpy(p.nonce, nonce.data(), std::min(nonce.size(), nonce_chars));
  p.address = reinterpret_cast<uint64_t>(nonce.data());
  p.arena_fd = arena != nullptr ? arena->fd() : -1;
  p.arena_base = arena != nullptr ? arena->base() : 0;
  p.arena_size = arena != nullptr ? arena->size() : 0;
  iovec iov{&p, sizeof p};
  return ring.write_all(&iov, 1, timeout);
}

caf::error say(tcp_socket& sock, const std::string& text) {
  return write_text_frame(sock, frame_kind::welcome, 0, text);
}

expected<std::string> hear(tcp_socket& sock) {
  inbound_frame f;
  if (auto err = read_frame(sock, f))
    return err;
  if (f.kind != frame_kind::welcome)
    return make_error(errc::malformed_message, "data connection with " + sock.peer() + ": frame kind "
                                                 + std::to_string(static_cast<uint32_t>(f.kind))
                                                 + " while choosing the path");
  return f.text;
}

} // namespace

// ---- the channel ----

shm_channel::shm_channel(shm_ring tx, shm_ring rx, int peer_pid, int liveness_fd, std::string peer)
  : tx_(std::move(tx)), rx_(std::move(rx)), peer_pid_(peer_pid), liveness_fd_(liveness_fd), peer_(std::move(peer)) {
  // The peer's process, while it lives (its pid could be another's later): what tells
  // the arena that buffers the peer may still read can go.
  peer_pidfd_ = open_pidfd(peer_pid);
  tx_.watch([this] { return watch(false); });
  rx_.watch([this] { return watch(true); });
}

shm_channel::~shm_channel() {
  close();
  give_back_unread();
  // Buffers the peer may still read in place stay until it lets go (or is gone): the
  // arena would otherwise hand them out again under its views.
  for (auto& k : kept_)
    for (auto& [slot, gen] : k.leases)
      hold(slot, gen, k.owner);
  if (peer_pidfd_ >= 0)
    ::close(peer_pidfd_);
}

// Reader side, once closed: the leases of pieces left in the ring unread (or begun and
// neither viewed nor copied whole) are given back, so that the writer need not keep their
// buffers until this process ends. The ring is closed: no read here waits.
void shm_channel::give_back_unread() {
  if (piece_left_ > 0 && piece_leased_)
    rx_.releaser(piece_slot_, piece_gen_)();
  if (piece_lent_)
    piece_left_ = 0; // (nothing of a lent piece is in the ring)
  char sink[4096];
  for (int pieces = 0; pieces < 1 << 20; ++pieces) { // (bounded: a ring holds fewer)
    while (piece_left_ > 0) { // a small piece's bytes
      const size_t k = static_cast<size_t>(std::min<uint64_t>(piece_left_, sizeof sink));
      if (rx_.read_exact(sink, k, std::chrono::milliseconds{0}))
        return;
      piece_left_ -= k;
    }
    if (next_piece())
      return;
    if (piece_leased_)
      rx_.releaser(piece_slot_, piece_gen_)();
    if (piece_lent_)
      piece_left_ = 0;
  }
}

void shm_channel::hold(uint32_t slot, uint32_t gen, const std::shared_ptr<void>& owner) {
  const int pidfd = peer_pidfd_ >= 0 ? ::fcntl(peer_pidfd_, F_DUPFD_CLOEXEC, 0) : -1;
  shm_arena::hold_until(tx_.released_check(slot, gen), pidfd, peer_pid_, owner);
}

void shm_channel::close() {
  tx_.close();
  rx_.close();
}

void shm_channel::share_arenas(std::shared_ptr<shm_arena> mine, bool peer_maps_mine,
                               std::shared_ptr<peer_arena> theirs) {
  arena_ = std::move(mine);
  peer_maps_arena_ = arena_ != nullptr && peer_maps_mine;
  peer_arena_ = std::move(theirs);
  free_slots_.clear();
  generation_.assign(shm_ring::lease_slots, 0);
  if (peer_maps_arena_)
    for (uint32_t s = shm_ring::lease_slots; s-- > 0;)
      free_slots_.push_back(s);
}

bool shm_channel::share(wire::shared_tensor& t, std::optional<uint64_t> version) {
  if (!peer_maps_arena_)
    return false;
  auto shared = arena_->share(t, version);
  if (!shared)
    return false;
  t = std::move(*shared);
  return true;
}

size_t shm_channel::leased() const {
  size_t n = 0;
  for (const auto& k : kept_)
    n += k.leases.size();
  return n;
}

void shm_channel::set_read_deadline(std::optional<std::chrono::steady_clock::time_point> deadline) {
  deadline_ns_ = deadline ? std::chrono::duration_cast<std::chrono::nanoseconds>(deadline->time_since_epoch()).count()
                          : 0;
}

// While waiting: the TCP connection carries nothing after the switch, so anything on it
// (its end, above all) means the peer is gone.
caf::error shm_channel::watch(bool reading) {
  if (liveness_fd_ >= 0) {
    pollfd p{liveness_fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0)
      return unreachable(peer_, std::string{"the peer's connection ended while "} + (reading ? "reading" : "writing"));
  }
  const int64_t d = deadline_ns_.load();
  if (d != 0 && reading && steady_now().time_since_epoch() > std::chrono::nanoseconds{d})
    return unreachable(peer_, "the read's deadline passed");
  return {};
}

caf::error shm_channel::write_all(iovec* iov, int count) {
  // Heads and small buffers go into the ring in one write; large buffers are lent, those
  // in the job's arena under a lease where the peer maps it.
  auto owner = std::move(owner_);
  const size_t threshold = owner ? kept_lend_threshold : lend_threshold;
  std::vector<piece_head> heads(static_cast<size_t>(count));
  std::vector<iovec> out;
  out.reserve(2 * static_cast<size_t>(count));
  uint64_t lent = 0;
  kept_write k;
  for (int i = 0; i < count; ++i) {
    if (iov[i].iov_len == 0)
      continue;
    auto& h = heads[static_cast<size_t>(i)];
    const size_t len = iov[i].iov_len;
    const bool lend = len >= threshold && (!owner || i >= 2);
    const bool lease = lend && owner && peer_maps_arena_ && len < max_leased_bytes && !free_slots_.empty()
                       && arena_->contains(iov[i].iov_base, len);
    h.length = len | (lend ? lent_bit : 0);
    h.address = lend ? reinterpret_cast<uint64_t>(iov[i].iov_base) : 0;
    if (lease) {
      const uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      const uint32_t gen = generation_[slot] = generation_[slot] % 0xFFFFu + 1;
      h.length |= leased_bit | (uint64_t{slot} << 48) | (uint64_t{gen} << 32);
      k.leases.emplace_back(slot, gen);
    }
    out.push_back({&h, sizeof h});
    if (lend && !lease)
      ++lent;
    else if (!lend)
      out.push_back(iov[i]);
  }
  // A failed write may have put part of a frame into the ring, heads of lent buffers
  // among them: the channel is closed before those buffers can go (the reader checks
  // after each lent copy that the channel was still open; leased ones stay until the peer
  // lets go of them).
  if (auto err = tx_.write_all(out.data(), static_cast<int>(out.size()))) {
    close();
    for (auto& [slot, gen] : k.leases)
      hold(slot, gen, owner);
    return err;
  }
  lent_ += lent;
  release_fetched(); // what earlier kept writes lent and the reader has copied by now
  if (!owner) {
    auto err = lent > 0 ? tx_.await_fetched(lent_) : caf::error{};
    if (err)
      close(); // the caller's buffers may go now: the reader must not copy them
    return err;
  }
  if (lent > 0 || !k.leases.empty()) { // this write's buffers stay
    k.fetched_at = lent_;
    k.owner = std::move(owner);
    kept_.push_back(std::move(k));
  }
  return {};
}

void shm_channel::release_fetched() {
  const uint64_t done = tx_.fetched();
  for (auto it = kept_.begin(); it != kept_.end();) {
    auto& leases = it->leases;
    leases.erase(std::remove_if(leases.begin(), leases.end(),
                                [&](const std::pair<uint32_t, uint32_t>& l) {
                                  if (tx_.released(l.first) != l.second)
                                    return false;
                                  free_slots_.push_back(l.first);
                                  return true;
                                }),
                 leases.end());
    it = it->fetched_at <= done && leases.empty() ? kept_.erase(it) : std::next(it);
  }
}

caf::error shm_channel::next_piece() {
  piece_head h;
  if (auto err = rx_.read_exact(&h, sizeof h))
    return err;
  piece_lent_ = (h.length & lent_bit) != 0;
  piece_leased_ = (h.length & leased_bit) != 0;
  piece_addr_ = h.address;
  if (piece_leased_) {
    if (!piece_lent_)
      return make_error(errc::malformed_message, "shared-memory channel with " + peer_ + ": a leased piece not lent");
    piece_slot_ = static_cast<uint32_t>((h.length >> 48) & 0xFF);
    piece_gen_ = static_cast<uint32_t>((h.length >> 32) & 0xFFFF);
    piece_left_ = h.length & (max_leased_bytes - 1);
  } else {
    piece_left_ = h.length & ~lent_bit;
  }
  if (piece_left_ == 0)
    return make_error(errc::malformed_message, "shared-memory channel with " + peer_ + ": an empty piece");
  return {};
}

void shm_channel::piece_done() {
  if (piece_leased_)
    rx_.releaser(piece_slot_, piece_gen_)(); // copied: the writer may let go of it
  else if (piece_lent_)
    rx_.mark_fetched();
}

std::shared_ptr<const void> shm_channel::read_view(size_t n) {
  if (piece_left_ == 0 && !pending_error_)
    pending_error_ = next_piece(); // (returned by the next read_exact)
  if (pending_error_ || !piece_leased_ || piece_left_ != n || !peer_arena_ || piece_addr_ % alignof(float) != 0)
    return nullptr;
  const uint8_t* at = peer_arena_->find(piece_addr_, n);
  if (at == nullptr)
    return nullptr;
  piece_left_ = 0;
  // The view keeps the peer's mapping and, when it goes, gives the lease back.
  return std::shared_ptr<const void>(at, [keep = peer_arena_, release = rx_.releaser(piece_slot_, piece_gen_)](
                                           const void*) { release(); });
}

caf::error shm_channel::read_exact(void* buf, size_t n) {
  if (pending_error_)
    return std::exchange(pending_error_, caf::error{});
  auto* at = static_cast<uint8_t*>(buf);
  while (n > 0) {
    if (piece_left_ == 0) {
      if (auto err = next_piece())
        return err;
      continue;
    }
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, piece_left_));
    if (piece_lent_) {
      const uint8_t* mapped = piece_leased_ && peer_arena_ ? peer_arena_->find(piece_addr_, k) : nullptr;
      if (mapped != nullptr)
        std::memcpy(at, mapped, k);
      else if (auto err = read_peer_memory(peer_pid_, piece_addr_, at, k))
        return err;
      // The writer lets go of a lent buffer only once the reader fetched it or after the
      // channel was closed: a copy made before the ring was closed is whole. (A leased one
      // stays until the lease is given back, closed or not.)
      if (!piece_leased_ && rx_.closed())
        return unreachable(peer_, "closed while a lent buffer was read");
      piece_addr_ += k;
    } else if (auto err = rx_.read_exact(at, k)) {
      return err;
    }
    piece_left_ -= k;
    if (piece_left_ == 0)
      piece_done();
    at += k;
    n -= k;
  }
  return {};
}

caf::error read_peer_memory(int pid, uint64_t addr, void* buf, size_t n) {
  auto* out = static_cast<uint8_t*>(buf);
  while (n > 0) {
    iovec local{out, n};
    iovec remote{reinterpret_cast<void*>(addr), n};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      const int e = got < 0 ? errno : EFAULT;
      if (e == ESRCH)
        return make_error(errc::peer_unreachable, "process " + std::to_string(pid) + " is gone");
      return make_error(e == EFAULT ? errc::malformed_message : errc::peer_unreachable,
                        "reading " + std::to_string(n) + " bytes lent by process " + std::to_string(pid) + ": "
                          + errno_text(e));
    }
    out += got;
    addr += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
  return {};
}

// ---- the switch ----

shm_offer::shm_offer(shm_offer&& o) noexcept : fd(std::exchange(o.fd, -1)), name(std::move(o.name)) {
}

shm_offer& shm_offer::operator=(shm_offer&& o) noexcept {
  if (this != &o) {
    if (fd >= 0)
      ::close(fd);
    fd = std::exchange(o.fd, -1);
    name = std::move(o.name);
  }
  return *this;
}

shm_offer::~shm_offer() {
  if (fd >= 0)
    ::close(fd);
}

expected<shm_offer> offer_shm() {
  shm_offer o;
  o.name = "ashlar-dp-" + random_hex(16);
  o.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (o.fd < 0)
    return make_error(errc::io_error, "socket(AF_UNIX): " + errno_text(errno));
  socklen_t len = 0;
  auto addr = abstract_address(o.name, len);
  if (::bind(o.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(o.fd, 4) != 0)
    return make_error(errc::io_error, "listening on a shared-memory offer: " + errno_text(errno));
  return o;
}

std::string shm_hello_part(const shm_offer& offer) {
  return " shm=" + offer.name.substr(offer.name.rfind('-') + 1);
}

std::optional<std::string> shm_name_in_hello(const std::string& hello) {
  auto at = hello.find(" shm=");
  if (at == std::string::npos)
    return std::nullopt;
  auto hex = hello.substr(at + 5, 32);
  if (hex.size() != 32 || !is_hex(hex))
    return std::nullopt;
  return "ashlar-dp-" + hex;
}

expected<std::string> shm_server_offer(const std::string& name, shm_pending& pending,
                                       std::chrono::milliseconds timeout, std::shared_ptr<shm_arena> arena) {
  auto offer = connect_offer(name, pending.peer_pid);
  if (!offer)
    return offer.error();
  auto c2s = shm_ring::create(shm_channel::ring_bytes, "ashlar-dp-c2s");
  auto s2c = c2s ? shm_ring::create(shm_channel::ring_bytes, "ashlar-dp-s2c") : expected<shm_ring>{c2s.error()};
  if (!s2c) {
    ::close(*offer);
    return s2c.error();
  }
  if (auto err = pass_segments(*offer, c2s->fd(), s2c->fd()))
    return err;
  pending.nonce = random_hex(nonce_chars / 2);
  pending.arena = std::move(arena);
  if (auto err = write_proof(*s2c, pending.nonce, timeout, pending.arena.get()))
    return err;
  pending.c2s.emplace(std::move(*c2s));
  pending.s2c.emplace(std::move(*s2c));
  return "shm " + pending.nonce;
}

expected<std::unique_ptr<shm_channel>> shm_switch_client(tcp_socket& sock, shm_offer& offer,
                                                         const std::string& welcome,
                                                         std::chrono::milliseconds timeout, std::string& why,
                                                         std::shared_ptr<shm_arena> arena) {
  if (welcome.rfind("shm ", 0) != 0) {
    why = welcome.rfind("tcp ", 0) == 0 ? "the shard node: " + welcome.substr(4)
                                        : "the shard node offered no shared memory";
    return std::unique_ptr<shm_channel>{};
  }
  const std::string nonce = welcome.substr(4);
  int fds[2] = {-1, -1};
  int pid = 0;
  std::optional<shm_ring> c2s, s2c;
  std::shared_ptr<peer_arena> theirs;
  auto err = receive_segments(offer, timeout, fds, pid);
  if (!err) {
    auto a = shm_ring::attach(fds[0], "ashlar-dp-c2s");
    auto b = a ? shm_ring::attach(fds[1], "ashlar-dp-s2c") : expected<shm_ring>{a.error()};
    ::close(fds[0]);
    ::close(fds[1]);
    if (b) {
      c2s.emplace(std::move(*a));
      s2c.emplace(std::move(*b));
      err = check_proof(*s2c, nonce, pid, timeout, theirs);
    } else {
      err = b.error();
    }
  }
  if (!err) // `nonce` stays put until the server's answer
    err = write_proof(*c2s, nonce, timeout, arena.get());
  if (err) {
    why = describe(err);
    if (auto e = say(sock, "tcp " + why))
      return e;
    return std::unique_ptr<shm_channel>{};
  }
  // "shm", and " arena" when this end mapped the peer's arena (it reads in place).
  if (auto e = say(sock, theirs ? "shm arena" : "shm"))
    return e;
  auto answer = hear(sock);
  if (!answer)
    return answer.error();
  if (*answer != "shm" && *answer != "shm arena") {
    why = "the shard node: " + answer->substr(std::min<size_t>(4, answer->size()));
    return std::unique_ptr<shm_channel>{};
  }
  auto ch = std::make_unique<shm_channel>(std::move(*c2s), std::move(*s2c), pid, sock.fd(), sock.peer());
  ch->share_arenas(std::move(arena), *answer == "shm arena", std::move(theirs));
  return ch;
}

expected<std::unique_ptr<shm_channel>> shm_switch_server(tcp_socket& sock, shm_pending& pending,
                                                         std::chrono::milliseconds timeout, std::string& why) {
  auto answer = hear(sock);
  if (!answer)
    return answer.error();
  if (*answer != "shm" && *answer != "shm arena") {
    why = "the peer: " + answer->substr(std::min<size_t>(4, answer->size()));
    return std::unique_ptr<shm_channel>{};
  }
  pending.peer_maps_arena = *answer == "shm arena";
  std::shared_ptr<peer_arena> theirs;
  if (auto err = check_proof(*pending.c2s, pending.nonce, pending.peer_pid, timeout, theirs)) {
    why = describe(err);
    if (auto e = say(sock, "tcp " + why))
      return e;
    return std::unique_ptr<shm_channel>{};
  }
  if (auto e = say(sock, theirs ? "shm arena" : "shm"))
    return e;
  auto ch = std::make_unique<shm_channel>(std::move(*pending.s2c), std::move(*pending.c2s), pending.peer_pid,
                                          sock.fd(), sock.peer());
  ch->share_arenas(std::move(pending.arena), pending.peer_maps_arena, std::move(theirs));
  return ch;
}

}  // namespace ashlar::net
