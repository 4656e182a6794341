// ashlar: train data-parallel models on heterogeneous workers.
#include <csignal>
#include <malloc.h>

#include "apps/ashlar/host.hpp"

int main(int argc, char** argv) {
  // The process is Ashlar's own (a host process, the Python package's, keeps its allocator).
  // Tensor messages are large and come and go every step: keep such blocks in the heap
  // instead of mapping and unmapping (and page-faulting) them each time.
  mallopt(M_MMAP_THRESHOLD, 512 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
  // A peer closing a TLS connection must not end the process with SIGPIPE (Python ignores
  // it already).
  std::signal(SIGPIPE, SIG_IGN);
  return ashlar::cli::run_cli(argc, argv);
}
