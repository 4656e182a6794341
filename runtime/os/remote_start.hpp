// How `ashlar launch --hosts` starts a node on another host and speaks to it: the node runs
// under ssh (BatchMode: a host that would ask for a password fails at once), and ssh's
// standard input is the launcher's channel to it. The channel carries, in order:
//
//   1. the node's credentials, so that no secret is on a command line or left in a file the
//      launcher wrote on that host: "ashlar-credentials 1", "token HEX", one "file NAME HEX"
//      per TLS file (ca.pem, node.pem, node.key), then "end";
//   2. control lines: "signal N" (SIGINT, SIGTERM: stop as on that signal; SIGKILL: exit now).
//
// The end of the channel (the launcher or its ssh gone) is a stop request: a node never
// outlives the launch that started it. Pure: text in, text out.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// `s` quoted for a POSIX shell ('...', with ' written as '\'').
std::string shell_quote(const std::string& s);

/// The command a remote shell runs: cd to `cwd` (ignored where that host lacks it, as
/// horovodrun does), then exec `argv`, every word quoted.
std::string remote_command(const std::vector<std::string>& argv, const std::string& cwd);

struct ssh_options {
  std::string program = "ssh";   ///< the ssh client
  uint16_t port = 0;             ///< -p; 0: ssh's own (its config, else 22)
  std::string identity_file;     ///< -i; "": ssh's own
  std::string config_file;       ///< -F; "": ~/.ssh/config
  double connect_timeout_s = 10; ///< ConnectTimeout
};

/// The ssh command line that runs `command` on `host` ("[::1]" is given to ssh as ::1).
std::vector<std::string> ssh_argv(const ssh_options& o, const std::string& host, const std::string& command);

struct launch_credentials {
  std::string token;                                       ///< the cluster token ("" for none)
  std::vector<std::pair<std::string, std::string>> files;  ///< TLS files: name (no '/'), contents
};

/// The credentials as channel lines, "end" included.
std::string encode_credentials(const launch_credentials& c);

/// Reads the credentials back, line by line.
class credentials_reader {
public:
  enum class status { more, done, bad };
  /// Takes one line (without its '\n'); `bad` sets error().
  status feed(const std::string& line);
  const launch_credentials& credentials() const { return c_; }
  const std::string& error() const { return error_; }

private:
  launch_credentials c_;
  std::string error_;
  bool header_ = false;
};

/// "signal N\n".
std::string signal_line(int sig);
/// The signal of a control line, 0 for a line that is not one.
int parse_signal_line(const std::string& line);

} // namespace ashlar
