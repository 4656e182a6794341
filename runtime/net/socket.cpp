#include "runtime/net/socket.hpp"
#include "runtime/net/records.hpp"
#include "runtime/core/clock.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <openssl/evp.h>
#include <unistd.h>

namespace ashlar::net {

namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

std::string sockaddr_text(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return std::string{buf} + ":" + std::to_string(ntohs(a.sin_port));
}

expected<sockaddr_in> resolve(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (host.empty() || host == "0.0.0.0") {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    return a;
  }
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1)
    return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return make_error(errc::peer_unreachable, "cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

} // namespace

tcp_socket::tcp_socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {
}

tcp_socket::~tcp_socket() {
  if (fd_ >= 0)
    ::close(fd_);
}

tcp_socket::tcp_socket(tcp_socket&& other) noexcept
  : fd_(std::exchange(other.fd_, -1)),
    peer_(std::move(other.peer_)),
    shut_(other.shut_.load()),
    aead_(std::move(other.aead_)),
    deadline_(other.deadline_) {
}

tcp_socket& tcp_socket::operator=(tcp_socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    peer_ = std::move(other.peer_);
    shut_ = other.shut_.load();
    aead_ = std::move(other.aead_);
    deadline_ = other.deadline_;
  }
  return *this;
}

caf::error tcp_socket::read_raw(void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (deadline_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline_ - steady_now());
      pollfd pf{fd_, POLLIN, 0};
      int ready = left.count() > 0 ? ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left.count(), 60000))) : 0;
      if (ready < 0 && errno == EINTR)
        continue;
      if (ready == 0 && steady_now() >= *deadline_)
        return make_error(errc::peer_unreachable, "a message from " + peer_ + " did not arrive whole by its deadline");
      if (ready == 0)
        continue;
    }
    ssize_t got = ::recv(fd_, p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR)
      continue;
    if (got == 0 || shut_)
      return make_error(errc::peer_unreachable, "connection to " + peer_ + " closed");
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return make_error(errc::peer_unreachable, "no data from " + peer_ + " within the timeout");
    return make_error(errc::peer_unreachable, "reading from " + peer_ + ": " + errno_text(errno));
  }
  return {};
}

caf::error tcp_socket::write_raw(iovec* iov, int count) {
  msghdr msg{};
  while (count > 0) {
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR)
        continue;
      if (shut_)
        return make_error(errc::peer_unreachable, "connection to " + peer_ + " closed");
      return make_error(errc::peer_unreachable, "writing to " + peer_ + ": " + errno_text(errno));
    }
    auto left = static_cast<size_t>(sent);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return {};
}

// ---- sealed records (records.hpp) ----

struct tcp_socket::aead {
  aead(const uint8_t (&tx_key)[32], const uint8_t (&rx_key)[32]) : tx(tx_key), rx(rx_key) {}
  record_cipher tx, rx;
  std::vector<uint8_t> out;   // the record being written
  std::vector<uint8_t> plain; // the record being read
  size_t plain_at = 0;
};

void tcp_socket::seal(const uint8_t (&tx_key)[32], const uint8_t (&rx_key)[32]) {
  aead_ = std::make_shared<aead>(tx_key, rx_key);
}

size_t tcp_socket::record_buffer_bytes() const {
  return aead_ ? aead_->out.capacity() + aead_->plain.capacity() : 0;
}

int tcp_socket::release() {
  return std::exchange(fd_, -1);
}

caf::error tcp_socket::read_exact(void* buf, size_t n) {
  if (!aead_)
    return read_raw(buf, n);
  auto& a = *aead_;
  auto* out = static_cast<uint8_t*>(buf);
  while (n > 0) {
    if (a.plain_at == a.plain.size()) {
      uint8_t head[4];
      if (auto err = read_raw(head, 4))
        return err;
      const size_t len = record_cipher::length_of(head);
      if (len == 0 || len > max_record_bytes)
        return make_error(errc::malformed_message, "a sealed record of " + std::to_string(len) + " bytes from "
                                                     + peer_ + " (at most " + std::to_string(max_record_bytes) + ")");
      // A record the caller wants whole is read and opened in its own buffer (no copy);
      // otherwise in ours, and handed out piece by piece.
      const bool direct = n >= len;
      uint8_t* dst = direct ? out : nullptr;
      if (!direct) {
        a.plain.resize(len);
        dst = a.plain.data();
      }
      uint8_t tag[record_tag_bytes];
      if (auto err = read_raw(dst, len))
        return err;
      if (auto err = read_raw(tag, sizeof tag))
        return err;
      if (!a.rx.open(head, dst, len, tag))
        return make_error(errc::malformed_message, "a record from " + peer_ + " failed authentication");
      if (direct) {
        out += len;
        n -= len;
        continue;
      }
      a.plain_at = 0;
    }
    size_t take = std::min(n, a.plain.size() - a.plain_at);
    std::memcpy(out, a.plain.data() + a.plain_at, take);
    a.plain_at += take;
    out += take;
    n -= take;
    if (a.plain_at == a.plain.size() && a.plain.capacity() > seal_buffer_bytes) {
      std::vector<uint8_t>().swap(a.plain); // a record read in pieces: its buffer is not kept while idle
      a.plain_at = 0;
    }
  }
  return {};
}

caf::error tcp_socket::write_all(iovec* iov, int count) {
  if (!aead_)
    return write_raw(iov, count);
  // Each buffer starts a record of its own (a frame's header, metadata and payload are
  // read one by one, each straight into its destination, so the reader keeps no record
  // buffer), and records are sealed into a small fixed buffer sent whenever it fills: a
  // connection holds seal_buffer_bytes however large its messages.
  auto& t = aead_->tx;
  auto& buf = aead_->out;
  buf.resize(seal_buffer_bytes);
  size_t used = 0;
  auto flush = [&]() -> caf::error {
    iovec whole{buf.data(), used};
    used = 0;
    return write_raw(&whole, 1);
  };
  auto room = [&](size_t n) -> caf::error { return buf.size() - used < n ? flush() : caf::error{}; };
  const auto failed = [&] { return make_error(errc::io_error, "cannot seal a record for " + peer_); };
  for (int k = 0; k < count; ++k) {
    auto* src = static_cast<const uint8_t*>(iov[k].iov_base);
    for (size_t left = iov[k].iov_len; left > 0;) {
      const size_t len = std::min(left, write_record_bytes);
      if (auto err = room(record_head_bytes))
        return err;
      if (!t.begin(buf.data() + used, len))
        return failed();
      used += record_head_bytes;
      for (size_t rem = len; rem > 0;) {
        if (auto err = room(1))
          return err;
        const size_t piece = std::min(rem, buf.size() - used);
        if (!t.update(src, piece, buf.data() + used))
          return failed();
        used += piece;
        src += piece;
        rem -= piece;
      }
      if (auto err = room(record_tag_bytes))
        return err;
      if (!t.finish(buf.data() + used))
        return failed();
      used += record_tag_bytes;
      left -= len;
    }
  }
  return used > 0 ? flush() : caf::error{};
}

caf::error tcp_socket::set_timeout(std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0
      || ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
    return make_error(errc::io_error, "setting a timeout on the connection to " + peer_ + ": "
                                        + errno_text(errno));
  return {};
}

void tcp_socket::shutdown() {
  if (fd_ >= 0 && !shut_.exchange(true))
    ::shutdown(fd_, SHUT_RDWR);
}

expected<tcp_socket> connect_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  auto addr = resolve(host, port);
  if (!addr)
    return addr.error();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return make_error(errc::io_error, "socket(): " + errno_text(errno));
  tcp_socket sock{fd, where};
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr);
  if (rc != 0 && errno != EINPROGRESS)
    return make_error(errc::peer_unreachable, "cannot connect to " + where + ": " + errno_text(errno));
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    int ready;
    do {
      ready = ::poll(&p, 1, static_cast<int>(timeout.count()));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0)
      return make_error(errc::peer_unreachable, "cannot connect to " + where + ": no answer within "
                                                  + std::to_string(timeout.count()) + " ms");
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (ready < 0 || err != 0)
      return make_error(errc::peer_unreachable, "cannot connect to " + where + ": "
                                                  + errno_text(ready < 0 ? errno : err));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return sock;
}

tcp_listener::~tcp_listener() {
  if (fd_ >= 0)
    ::close(fd_);
}

tcp_listener::tcp_listener(tcp_listener&& other) noexcept
  : fd_(std::exchange(other.fd_, -1)), port_(other.port_), shut_(other.shut_.load()) {
}

tcp_listener& tcp_listener::operator=(tcp_listener&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
    shut_ = other.shut_.load();
  }
  return *this;
}

expected<tcp_listener> tcp_listener::open(const std::string& host, uint16_t port) {
  const std::string where = (host.empty() ? "0.0.0.0" : host) + ":" + std::to_string(port);
  auto addr = resolve(host, port);
  if (!addr)
    return addr.error();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return make_error(errc::io_error, "socket(): " + errno_text(errno));
  tcp_listener l;
  l.fd_ = fd;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0)
    return make_error(errc::io_error, "cannot listen on " + where + ": " + errno_text(errno));
  if (::listen(fd, 128) != 0)
    return make_error(errc::io_error, "cannot listen on " + where + ": " + errno_text(errno));
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  l.port_ = ntohs(bound.sin_port);
  return l;
}

expected<tcp_socket> tcp_listener::accept() {
  for (;;) {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return tcp_socket{fd, sockaddr_text(peer)};
    }
    if (shut_)
      return make_error(errc::invalid_state, "listener on port " + std::to_string(port_) + " closed");
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    return make_error(errc::io_error, "accept on port " + std::to_string(port_) + ": " + errno_text(errno));
  }
}

void tcp_listener::shutdown() {
  if (fd_ >= 0 && !shut_.exchange(true))
    ::shutdown(fd_, SHUT_RDWR);
}

std::string local_address_toward(const std::string& host, uint16_t port) {
  auto addr = resolve(host, port == 0 ? 9 : port);
  if (!addr)
    return "";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return "";
  std::string out;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
      out = buf;
    }
  }
  ::close(fd);
  return out;
}

}  // namespace ashlar::net
