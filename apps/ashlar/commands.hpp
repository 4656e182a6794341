// The `ashlar` command's subcommands. Each registers its options on the CLI11 app and
// returns the function that runs it (exit code: 0 ok, 1 failure, 2 bad usage or config).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ashlar::cli {

using command_fn = std::function<int()>;

command_fn add_train(CLI::App& app);
command_fn add_bench(CLI::App& app);
command_fn add_node(CLI::App& app);
command_fn add_status(CLI::App& app);
command_fn add_ctl(CLI::App& app);
command_fn add_launch(CLI::App& app);
/// `ashlar launch ... -- ARGS`: the worker scripts' own arguments (run_cli takes them off
/// the command line before parsing it).
std::vector<std::string>& launch_script_args();
command_fn add_checkpoint(CLI::App& app);
command_fn add_cert(CLI::App& app);
command_fn add_config(CLI::App& app);

/// "ashlar 0.1.0 (commit ..., CUDA on|off, CAF 0.17.6, ..., Release build, compiler)".
std::string version_text();

}  // namespace ashlar::cli
