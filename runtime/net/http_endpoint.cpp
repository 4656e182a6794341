#include "runtime/net/http_endpoint.hpp"

#include <mutex>
#include <thread>

#include <httplib.h>

namespace ashlar {

struct http_endpoint::impl {
  httplib::Server server;
  std::thread thread;
  std::mutex mu;
  std::string text;
  std::string host;
  uint16_t port = 0;
};

http_endpoint::http_endpoint(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

expected<std::unique_ptr<http_endpoint>> http_endpoint::start(const std::string& host, uint16_t port) {
  auto p = std::make_unique<impl>();
  auto* raw = p.get();
  p->server.Get("/metrics", [raw](const httplib::Request&, httplib::Response& res) {
    std::string body;
    {
      std::lock_guard<std::mutex> lock{raw->mu};
      body = raw->text;
    }
    res.set_content(body, "text/plain; version=0.0.4; charset=utf-8");
  });
  p->server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ashlar: metrics at /metrics\n", "text/plain");
  });
  p->server.set_read_timeout(5, 0);
  p->server.set_write_timeout(5, 0);
  const std::string where = host + ":" + std::to_string(port);
  if (port == 0) {
    int bound = p->server.bind_to_any_port(host);
    if (bound <= 0)
      return make_error(errc::io_error, "the metrics endpoint cannot listen on " + host + " (any port)");
    p->port = static_cast<uint16_t>(bound);
  } else {
    if (!p->server.bind_to_port(host, port))
      return make_error(errc::io_error, "the metrics endpoint cannot listen on " + where
                                          + " (in use, or not an address of this host)");
    p->port = port;
  }
  p->host = host;
  p->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  return std::unique_ptr<http_endpoint>(new http_endpoint(std::move(p)));
}

http_endpoint::~http_endpoint() {
  impl_->server.stop();
  if (impl_->thread.joinable())
    impl_->thread.join();
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
