// ashlar: train data-parallel models on heterogeneous workers.
#include <cstdio>
#include <csignal>
#include <malloc.h>

#include "apps/ashlar/commands.hpp"

int main(int argc, char** argv) {
  // Tensor messages are large and come and go every step: keep such blocks in the heap
  // instead of mapping and unmapping (and page-faulting) them each time.
  mallopt(M_MMAP_THRESHOLD, 512 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
  // A peer closing a TLS connection must not end the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"ashlar: heterogeneity-aware data-parallel training on an actor runtime"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ashlar 0.1.0");
  auto train = ashlar::cli::add_train(app);
  auto bench = ashlar::cli::add_bench(app);
  auto node = ashlar::cli::add_node(app);
  auto launch = ashlar::cli::add_launch(app);
  auto status = ashlar::cli::add_status(app);
  auto ctl = ashlar::cli::add_ctl(app);
  auto checkpoint = ashlar::cli::add_checkpoint(app);
  auto cert = ashlar::cli::add_cert(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (app.got_subcommand("train"))
    return train();
  if (app.got_subcommand("bench"))
    return bench();
  if (app.got_subcommand("node"))
    return node();
  if (app.got_subcommand("launch"))
    return launch();
  if (app.got_subcommand("status"))
    return status();
  if (app.got_subcommand("ctl"))
    return ctl();
  if (app.got_subcommand("checkpoint"))
    return checkpoint();
  if (app.got_subcommand("cert"))
    return cert();
  return 2;
}
