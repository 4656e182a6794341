#include "runtime/core/clock.hpp"
#include "runtime/net/handshake.hpp"

#include <cerrno>
#include <cstring>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

namespace ashlar::net {

namespace {

// A TLS record starts with content type 22 (handshake) for a ClientHello.
constexpr uint8_t tls_handshake_record = 0x16;

bool would_block() {
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

} // namespace

long tls_io::read_some(SSL* ssl, int fd, void* buf, size_t len) {
  if (len == 0)
    return 0;
  if (!ssl) {
    ssize_t n = ::recv(fd, buf, len, 0);
    if (n > 0)
      return n;
    if (n < 0 && would_block())
      return 0;
    return -1;
  }
  ERR_clear_error();
  int n = SSL_read(ssl, buf, static_cast<int>(std::min<size_t>(len, 1 << 30)));
  if (n > 0)
    return n;
  int e = SSL_get_error(ssl, n);
  return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

long tls_io::write_some(SSL* ssl, int fd, const void* buf, size_t len) {
  if (len == 0)
    return 0;
  if (!ssl) {
    ssize_t n = ::send(fd, buf, len, MSG_NOSIGNAL);
    if (n >= 0)
      return n;
    return would_block() ? 0 : -1;
  }
  ERR_clear_error();
  int n = SSL_write(ssl, buf, static_cast<int>(std::min<size_t>(len, 1 << 30)));
  if (n > 0)
    return n;
  int e = SSL_get_error(ssl, n);
  return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

handshake::handshake(int fd, bool server, const net_security& sec, std::vector<std::string> tokens)
  : fd_(fd), server_(server), seal_(sec.seal_records) {
  if (server && !tokens.empty())
    server_gate_.emplace(std::move(tokens));
  else if (server)
    server_gate_.emplace(sec.token);
  else
    client_gate_.emplace(sec.token);
  if (sec.tls)
    ssl_ = sec.tls->new_session(fd, server);
  else
    tls_done_ = true;
  sniffed_ = !server; // a client speaks first
  if (client_gate_)
    out_ = client_gate_->take_output();
  events_ = POLLIN;
}

handshake::~handshake() {
  if (ssl_)
    SSL_free(ssl_);
}

SSL* handshake::release_ssl() {
  had_tls_ = had_tls_ || ssl_ != nullptr;
  return std::exchange(ssl_, nullptr);
}

handshake::result handshake::fail(std::string why) {
  refused_ = true;
  why_ = std::move(why);
  events_ = 0;
  return result::refused;
}

bool handshake::flush() {
  while (!out_.empty()) {
    long n = tls_io::write_some(tls_done_ && ssl_ ? ssl_ : nullptr, fd_, out_.data(), out_.size());
    if (n < 0) {
      fail("the connection broke during the handshake");
      return false;
    }
    if (n == 0) {
      events_ = POLLOUT;
      return false;
    }
    out_.erase(out_.begin(), out_.begin() + n);
  }
  return true;
}

handshake::result handshake::step() {
  if (refused_)
    return result::refused;
  if (!tls_done_ && !ssl_)
    return fail("OpenSSL could not make a session for the connection");
  // A server looks at the first bytes before anything else, so a peer that speaks the
  // other kind of connection (TLS to a plain node, or plain to a TLS node) learns why.
  if (!sniffed_) {
    uint8_t head[sizeof gate_magic] = {};
    ssize_t n = ::recv(fd_, head, sizeof head, MSG_PEEK);
    if (n == 0)
      return fail("it closed the connection before the handshake");
    if (n < 0) {
      if (would_block()) {
        events_ = POLLIN;
        return result::pending;
      }
      return fail(std::string{"the connection broke: "} + std::strerror(errno));
    }
    // The first byte decides (waiting on peeked bytes would spin: they stay readable).
    bool speaks_tls = head[0] == tls_handshake_record;
    bool speaks_gate = std::memcmp(head, gate_magic, static_cast<size_t>(n)) == 0;
    if (ssl_ && !speaks_tls) {
      if (speaks_gate) {
        auto reply = gate_server::needs_tls_reply();
        (void) ::send(fd_, reply.data(), reply.size(), MSG_NOSIGNAL);
        return fail("it does not use TLS (a node or command started without --tls)");
      }
      return fail("it is not an Ashlar node (it did not start a TLS handshake)");
    }
    if (!ssl_ && speaks_tls)
      return fail("it speaks TLS, this node does not (start every node with the same --tls / --insecure "
                  "choice)");
    sniffed_ = true;
  }
  if (!tls_done_) {
    ERR_clear_error();
    int rc = SSL_do_handshake(ssl_);
    if (rc != 1) {
      int e = SSL_get_error(ssl_, rc);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        events_ = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return result::pending;
      }
      auto reason = tls_error_text();
      if (reason.empty())
        reason = "the connection closed";
      if (!server_ && reason.find("unexpected eof") != std::string::npos)
        reason += " (the node may run without TLS, or refused this node's certificate)";
      if (reason.find("unknown ca") != std::string::npos || reason.find("certificate verify failed") != std::string::npos)
        reason += " (the certificates are not signed by the same cluster CA)";
      return fail("TLS handshake failed: " + reason);
    }
    tls_done_ = true;
    peer_name_ = tls_peer_name(ssl_);
  }
  for (;;) {
    if (!flush())
      return refused_ ? result::refused : result::pending;
    gate_state st = server_gate_ ? server_gate_->state() : client_gate_->state();
    if (st == gate_state::admitted) {
      events_ = 0;
      return result::admitted;
    }
    if (st == gate_state::refused)
      return fail(server_gate_ ? server_gate_->why() : client_gate_->why());
    size_t want = server_gate_ ? server_gate_->wants() : client_gate_->wants();
    uint8_t buf[64];
    long n = tls_io::read_some(ssl_, fd_, buf, std::min(want, sizeof buf));
    if (n < 0)
      return fail(server_ ? "it closed the connection during the handshake"
                          : "the node closed the connection during the handshake (is it an Ashlar node of "
                            "this version? does it require TLS?)");
    if (n == 0) {
      events_ = POLLIN;
      return result::pending;
    }
    if (server_gate_) {
      server_gate_->feed(buf, static_cast<size_t>(n));
      auto more = server_gate_->take_output();
      out_.insert(out_.end(), more.begin(), more.end());
    } else {
      client_gate_->feed(buf, static_cast<size_t>(n));
      auto more = client_gate_->take_output();
      out_.insert(out_.end(), more.begin(), more.end());
    }
  }
}

handshake::result run_handshake(handshake& h, std::chrono::milliseconds timeout) {
  auto deadline = steady_now() + timeout;
  for (;;) {
    auto r = h.step();
    if (r != handshake::result::pending)
      return r;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_now());
    if (left.count() <= 0)
      return h.expire("the handshake did not finish within " + std::to_string(timeout.count()) + " ms");
    pollfd p{h.fd(), h.events(), 0};
    ::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 1000)));
  }
}

}  // namespace ashlar::net
