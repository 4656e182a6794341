// SIGINT and SIGTERM as a request to stop: a command polls for them between steps of its
// work (a job stops its workers after their current step and writes its report).
#pragma once

namespace ashlar::cli {

/// Catches SIGINT and SIGTERM from now on. With `second_aborts`, a second signal ends
/// the process at once (the default action), for a user who does not want to wait.
void catch_stop_signals(bool second_aborts);

/// The last stop signal caught and not yet taken (0: none).
int stop_signal();

/// Takes the last stop signal caught: returns it and clears it (0: none).
int take_stop_signal();

/// "SIGINT" or "SIGTERM".
const char* signal_name(int sig);

}  // namespace ashlar::cli
