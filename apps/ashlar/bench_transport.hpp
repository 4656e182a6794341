// `ashlar bench transport`: push and pull of one tensor between two processes of this
// host, over each path of the data plane (shared memory, TCP), beside memcpy.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace ashlar::cli {

struct transport_options {
  std::string sizes_mb = "1,16,100";
  double seconds = 1.0;
  bool json = false;
  uint64_t peer_floats = 0; // the peer process: its buffer
  std::string port_file;
};

void add_transport_bench(CLI::App* bench, transport_options& o, CLI::App*& cmd, CLI::App*& peer_cmd);
int run_transport(const transport_options& o, bool peer);

}  // namespace ashlar::cli
