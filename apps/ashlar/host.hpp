// The `ashlar` command line run inside a host process (the Python package): the same
// commands, with the host's compute backend for the workers they start in this process
// and the host's own signal handling.
#pragma once

#include "actors/gpu_actor.hpp"

namespace ashlar::cli {

/// Runs the command line `argv` (argv[0] is the program's name) as `ashlar` does and
/// returns its exit code. Blocks for the command's duration.
int run_cli(int argc, char** argv);

/// The backend every worker started in this process computes with (a local job's
/// workers, a worker node's): the host's, for example PyTorch through the Python package.
/// Null (the default): Ashlar's own (GPUs as run.gpus says, then the CPU).
void set_host_backend(actors::backend_factory make);
const actors::backend_factory& host_backend();

/// A host that handles SIGINT and SIGTERM itself: the commands install no handler and
/// stop when the host calls request_stop, as they would on the signal.
void leave_signals_to_host();
void request_stop(int sig);

}  // namespace ashlar::cli
