// A node started by `ashlar launch --hosts` over ssh: its standard input is the launcher's
// channel (runtime/os/remote_start.hpp says what it carries). The credentials it brings go
// to a private directory of this process's own (mode 0700), removed as soon as the node has
// loaded them; the lines after them, and the channel's end, become stop requests.
#pragma once

#include <memory>
#include <string>

#include "apps/ashlar/security_options.hpp"

namespace ashlar::cli {

/// The credentials' directory; removed (with what it holds) when this goes.
struct launcher_channel {
  std::string dir;
  ~launcher_channel();
};

/// Reads the credentials from stdin (blocking until "end"), writes them into a new private
/// directory, and points `sec` at them (its token file and TLS directory). Starts the thread
/// that turns later lines into stop requests: "signal 2/15" as that signal, "signal 9" exits
/// at once; the channel's end (the launcher gone) asks the node to stop and, 30 s later,
/// ends it. Ignores SIGPIPE (the launcher's ssh may go while the node writes). Fails naming
/// what the channel lacked.
[[nodiscard]] expected<std::unique_ptr<launcher_channel>> open_launcher_channel(security_options& sec);

}  // namespace ashlar::cli
