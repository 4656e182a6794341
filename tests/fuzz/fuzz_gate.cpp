// libFuzzer harness: the token gate (both sides) and the BASP frame guard, fed arbitrary
// bytes in arbitrary pieces.
#include <cstdint>

#include "runtime/net/gate.hpp"

using namespace ashlar::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const size_t piece = 1 + data[0] % 64;
  gate_nonce fixed{};
  gate_server server{std::vector<std::string>{"token", ""}, fixed};
  gate_client client{"token", fixed};
  basp_frame_guard guard{1 << 20};
  for (size_t at = 1; at < size; at += piece) {
    size_t n = std::min(piece, size - at);
    server.feed(data + at, std::min(n, server.wants()));
    client.feed(data + at, std::min(n, client.wants()));
    (void) server.take_output();
    (void) client.take_output();
    if (!guard.inspect(data + at, n))
      guard = basp_frame_guard{1 << 20};
  }
  return 0;
}
