#include "runtime/net/http_endpoint.hpp"
#include "runtime/os/threads.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/core/clock.hpp"

namespace ashlar {

namespace {

// One poll loop serves every scraper, so none can hold a thread: each connection has
// `request_deadline` for its whole request and the answer (a client that trickles its
// header a byte at a time is closed then, whatever it sends), a request is at most
// `max_request` bytes, and beyond `max_connections` the oldest connection is closed.
constexpr auto request_deadline = std::chrono::seconds(3);
constexpr size_t max_request = 8192;
constexpr size_t max_connections = 64;

struct connection {
  int fd = -1;
  std::chrono::steady_clock::time_point deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool answered = false;
};

std::string http_answer(int code, const char* reason, const std::string& type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type
         + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

// The answer to a whole request (its header ended by an empty line).
std::string answer_to(const std::string& request, const std::string& metrics) {
  const auto line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const auto sp1 = line.find(' ');
  const auto sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos)
    return http_answer(400, "Bad Request", "text/plain", "a request line is METHOD PATH VERSION\n");
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD")
    return http_answer(405, "Method Not Allowed", "text/plain", "only GET\n");
  std::string out;
  if (path == "/metrics")
    out = http_answer(200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics);
  else if (path == "/")
    out = http_answer(200, "OK", "text/plain", "ashlar: metrics at /metrics\n");
  else
    out = http_answer(404, "Not Found", "text/plain", "not found: metrics at /metrics\n");
  if (method == "HEAD")
    out.resize(out.find("\r\n\r\n") + 4);
  return out;
}

} // namespace

struct http_endpoint::impl {
  int listener = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::mutex mu;
  std::string text;
  std::string host;
  uint16_t port = 0;

  std::string metrics() {
    std::lock_guard<std::mutex> lock{mu};
    return text;
  }

  void accept_all(std::list<connection>& conns) {
    for (;;) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0)
        return;
      if (conns.size() >= max_connections) { // the oldest goes: no one holds the endpoint
        ::close(conns.front().fd);
        conns.pop_front();
      }
      connection c;
      c.fd = fd;
      c.deadline = steady_now() + request_deadline;
      conns.push_back(std::move(c));
    }
  }

  // Reads what came and writes what it can; false once the connection is done with.
  bool serve(connection& c) {
    char buf[4096];
    while (!c.answered) {
      ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return false;
      if (n < 0)
        break;
      c.in.append(buf, static_cast<size_t>(n));
      if (c.in.find("\r\n\r\n") != std::string::npos) {
        c.out = answer_to(c.in, metrics());
        c.answered = true;
      } else if (c.in.size() > max_request) {
        c.out = http_answer(431, "Request Header Fields Too Large", "text/plain", "request too large\n");
        c.answered = true;
      }
    }
    while (c.answered && c.sent < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.sent += static_cast<size_t>(n);
    }
    return !(c.answered && c.sent == c.out.size());
  }

  void run() {
    std::list<connection> conns;
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listener, POLLIN, 0});
      for (auto& c : conns)
        fds.push_back({c.fd, static_cast<short>(c.answered ? POLLOUT : POLLIN), 0});
      ::poll(fds.data(), fds.size(), 250);
      if (fds[0].revents & POLLIN)
        break;
      if (fds[1].revents & POLLIN)
        accept_all(conns);
      const auto now = steady_now();
      for (auto it = conns.begin(); it != conns.end();) {
        if (now > it->deadline || !serve(*it)) {
          ::close(it->fd);
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& c : conns)
      ::close(c.fd);
  }
};

http_endpoint::http_endpoint(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

expected<std::unique_ptr<http_endpoint>> http_endpoint::start(const std::string& host, uint16_t port) {
  const std::string where = host + ":" + (port == 0 ? std::string{"any port"} : std::to_string(port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0 || !found)
    return make_error(errc::io_error, "the metrics endpoint cannot listen on " + where + " (not an address of this host)");
  auto p = std::make_unique<impl>();
  int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0)
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool bound = fd >= 0 && ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  ::freeaddrinfo(found);
  if (!bound) {
    const int e = errno;
    if (fd >= 0)
      ::close(fd);
    return make_error(errc::io_error, "the metrics endpoint cannot listen on " + where + " ("
                                        + (e == EADDRINUSE ? std::string{"in use"} : std::strerror(e)) + ")");
  }
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  p->port = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  p->listener = fd;
  p->host = host;
  if (::pipe2(p->wake, O_CLOEXEC) != 0) {
    ::close(fd);
    return make_error(errc::io_error, "the metrics endpoint cannot make its wake-up pipe");
  }
  auto* raw = p.get();
  p->thread = std::thread([raw] {
    name_this_thread("ashlar.http");
    raw->run();
  });
  return std::unique_ptr<http_endpoint>(new http_endpoint(std::move(p)));
}

http_endpoint::~http_endpoint() {
  char c = 1;
  (void) !::write(impl_->wake[1], &c, 1);
  if (impl_->thread.joinable())
    impl_->thread.join();
  ::close(impl_->listener);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

caf::error parse_listen(const std::string& listen, std::string& host, uint16_t& port) {
  auto colon = listen.rfind(':');
  const std::string digits = colon == std::string::npos ? "" : listen.substr(colon + 1);
  if (colon == 0 || digits.empty() || digits.size() > 5
      || digits.find_first_not_of("0123456789") != std::string::npos || std::stoul(digits) > 65535)
    return make_error(errc::invalid_argument, "\"" + listen + "\" is not HOST:PORT (e.g. 0.0.0.0:9400)");
  host = listen.substr(0, colon);
  port = static_cast<uint16_t>(std::stoul(digits));
  return caf::none;
}

expected<std::unique_ptr<http_endpoint>> http_endpoint::start(const std::string& listen) {
  std::string host;
  uint16_t port = 0;
  if (auto err = parse_listen(listen, host, port))
    return err;
  return start(host, port);
}

uint16_t http_endpoint::port() const { return impl_->port; }

std::string http_endpoint::url() const {
  return "http://" + impl_->host + ":" + std::to_string(impl_->port) + "/metrics";
}

void http_endpoint::publish(std::string text) {
  std::lock_guard<std::mutex> lock{impl_->mu};
  impl_->text = std::move(text);
}

}  // namespace ashlar
