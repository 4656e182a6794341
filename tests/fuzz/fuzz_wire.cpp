// libFuzzer harness: every Cap'n Proto message decoder of runtime/wire/codec.hpp. The
// first byte picks the message type; the rest is the message's words.
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/wire/codec.hpp"

using namespace ashlar::wire;

namespace {

template <class T>
void try_decode(const std::vector<uint64_t>& w) {
  T out;
  if (!decode(w.data(), w.size(), out)) {
    // A message that decodes must encode again.
    auto again = encode(out);
    (void) again;
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  std::vector<uint64_t> w((size - 1) / 8);
  if (!w.empty())
    std::memcpy(w.data(), data + 1, w.size() * 8);
  switch (data[0] % 19) {
    case 0: try_decode<hello>(w); break;
    case 1: try_decode<welcome>(w); break;
    case 2: try_decode<spawn_shard>(w); break;
    case 3: try_decode<spawn_worker>(w); break;
    case 4: try_decode<job_request>(w); break;
    case 5: try_decode<job_result>(w); break;
    case 6: try_decode<ctl_request>(w); break;
    case 7: try_decode<cluster_status>(w); break;
    case 8: try_decode<register_worker>(w); break;
    case 9: try_decode<assignment>(w); break;
    case 10: try_decode<membership_change>(w); break;
    case 11: try_decode<pull_request>(w); break;
    case 12: try_decode<pull_reply>(w); break;
    case 13: try_decode<push>(w); break;
    case 14: try_decode<push_ack>(w); break;
    case 15: try_decode<ring_message>(w); break;
    case 16: try_decode<shard_status>(w); break;
    case 17: try_decode<profile_report>(w); break;
    case 18: try_decode<cluster_stats>(w); break;
  }
  return 0;
}
