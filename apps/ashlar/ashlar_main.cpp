// ashlar: train data-parallel models on heterogeneous workers.
#include "apps/ashlar/host.hpp"

int main(int argc, char** argv) {
  return ashlar::cli::run_cli(argc, argv);
}
