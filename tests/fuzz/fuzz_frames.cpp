// libFuzzer harness: the data plane's frame reader on a socket pair holding the input,
// plain and sealed (a sealed stream must fail authentication, never crash).
#include <cstdint>
#include <cstring>

#include <sys/socket.h>
#include <unistd.h>

#include "runtime/net/socket.hpp"
#include "runtime/net/tensor_frames.hpp"

using namespace ashlar::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1 << 20))
    return 0;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    return 0;
  int buf = 4 << 20;
  ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  ::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  (void) !::write(sv[0], data + 1, size - 1);
  ::shutdown(sv[0], SHUT_WR);
  tcp_socket sock{sv[1], "fuzz"};
  if (data[0] & 1) {
    const uint8_t key[32] = {1, 2, 3};
    sock.seal(key, key);
  }
  // A shard node bounds a request's tensor by its range (here 256 Ki floats): frames
  // announcing more are refused before allocation, and the fuzzer does not spend its time
  // zero-filling gigabyte vectors for them.
  for (int i = 0; i < 64; ++i) {
    inbound_frame f;
    if (read_frame(sock, f, uint64_t{1} << 20))
      break;
  }
  ::close(sv[0]);
  return 0;
}
