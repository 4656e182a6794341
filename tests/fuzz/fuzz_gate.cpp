// libFuzzer harness: the token gate (both sides), the BASP frame guard and the sealed
// record reader that carries every byte after the gate, fed arbitrary bytes in arbitrary
// pieces; and records sealed whole, then altered at a byte the input picks, which the
// reader must refuse.
#include <cstdint>

#include <cstring>
#include <vector>

#include "runtime/net/gate.hpp"
#include "runtime/net/records.hpp"

using namespace ashlar::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const size_t piece = 1 + data[0] % 64;
  gate_nonce fixed{};
  gate_server server{std::vector<std::string>{"token", ""}, fixed};
  gate_client client{"token", fixed};
  basp_frame_guard guard{1 << 20};
  const uint8_t key[32] = {7};
  record_reader reader{key};
  bool reading = true;
  for (size_t at = 1; at < size; at += piece) {
    size_t n = std::min(piece, size - at);
    server.feed(data + at, std::min(n, server.wants()));
    client.feed(data + at, std::min(n, client.wants()));
    (void) server.take_output();
    (void) client.take_output();
    if (!guard.inspect(data + at, n))
      guard = basp_frame_guard{1 << 20};
    if (reading) {
      size_t room = 0;
      uint8_t* into = reader.space(room, 64);
      size_t k = std::min(n, room);
      std::memcpy(into, data + at, k);
      reading = reader.commit(k);
      uint8_t out[97];
      while (reading && reader.take(out, sizeof out) > 0) {
      }
    }
  }
  // Sealed whole, then one byte altered: everything before the altered record comes out,
  // the altered record never does.
  record_writer writer{key};
  const size_t took = writer.seal(data, size);
  size_t n = 0;
  const uint8_t* sealed = writer.pending(n);
  std::vector<uint8_t> wire(sealed, sealed + n);
  wire[data[0] % wire.size()] ^= static_cast<uint8_t>(1 + (size % 255));
  record_reader check{key};
  size_t room = 0;
  uint8_t* into = check.space(room, wire.size());
  std::memcpy(into, wire.data(), wire.size());
  std::vector<uint8_t> out(took);
  if (check.commit(wire.size()) && check.take(out.data(), out.size()) > 0)
    __builtin_trap(); // an altered record was accepted
  return 0;
}
