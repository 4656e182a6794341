// A small HTTP server for Prometheus to scrape: GET /metrics answers the text last
// published (text/plain; version=0.0.4). One thread polls every connection, so a slow or
// stuck scraper never touches the actors nor holds up another scraper: each connection
// has 3 s for its whole request and answer, a request at most 8 KiB, and beyond 64
// connections the oldest is closed. The job driver publishes a fresh text as it goes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// Splits "HOST:PORT" (PORT 0 to 65535). Fails with invalid_argument, quoting `listen`.
[[nodiscard]] caf::error parse_listen(const std::string& listen, std::string& host, uint16_t& port);

class http_endpoint {
public:
  /// Listens on host:port (port 0: a free one, see port()). Fails with io_error naming
  /// the address when it cannot be bound.
  [[nodiscard]] static expected<std::unique_ptr<http_endpoint>> start(const std::string& host, uint16_t port);
  /// The same for "HOST:PORT"; invalid_argument if it is not of that form.
  [[nodiscard]] static expected<std::unique_ptr<http_endpoint>> start(const std::string& listen);
  ~http_endpoint(); // stops serving and joins the thread
  http_endpoint(const http_endpoint&) = delete;
  http_endpoint& operator=(const http_endpoint&) = delete;

  uint16_t port() const;
  /// "http://HOST:PORT/metrics", with the port actually bound.
  std::string url() const;
  /// What GET /metrics answers from now on.
  void publish(std::string text);

private:
  struct impl;
  explicit http_endpoint(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace ashlar
