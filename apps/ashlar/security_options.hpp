// The options every command that talks to a cluster shares: the cluster token, the node's
// TLS credentials, and the rule that a node listening beyond loopback uses TLS.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "actors/cluster/network.hpp"

namespace ashlar::cli {

struct security_options {
  std::string token_file;
  std::string tls_dir;
  bool insecure = false;
  double max_message_mb = 256;
  double max_in_flight_mb = 1024;
  uint32_t max_per_source = 512;
  double handshake_timeout = 5;
};

/// Adds --token-file, --tls, --insecure (if `listens`) and --max-message-mb to `cmd`.
void add_security_options(CLI::App* cmd, security_options& o, bool listens);

/// The token (--token-file, else $ASHLAR_TOKEN) and TLS credentials (--tls, else
/// $ASHLAR_TLS_DIR). Fails naming the file.
[[nodiscard]] expected<net::net_security> load_security(const security_options& o);
/// The same for a client of the cluster at `join` (HOST:PORT): without --token-file,
/// $ASHLAR_TOKEN or TLS, the token a scheduler on this host wrote for that port
/// (~/.ashlar/cluster-PORT.token, or under $ASHLAR_HOME), where there is one.
[[nodiscard]] expected<net::net_security> load_security(const security_options& o, const std::string& join);

/// True for addresses only this host reaches (127.0.0.0/8, ::1, localhost).
bool is_loopback(const std::string& host);

/// A node that listens on `host` without TLS is refused unless the user said --insecure:
/// the error says why and what to do.
[[nodiscard]] caf::error check_listen_policy(const std::string& host, const net::net_security& sec,
                                             bool insecure, const char* what);

/// The options a node or command passes on for others to join the same cluster, e.g.
/// " --token-file F --tls DIR" (as given on this command line).
std::string join_hint(const security_options& o);

/// A fresh random cluster token (256 bits, hex).
std::string make_token();

/// This user's directory for cluster tokens ($ASHLAR_HOME, else ~/.ashlar, else
/// $XDG_RUNTIME_DIR/ashlar; never /tmp), made mode 0700 if missing; refused (naming it and
/// what to do) when it is another user's, a link, or writable by others.
[[nodiscard]] expected<std::string> private_token_dir();

/// Writes `token` to private_token_dir()/cluster-PORT.token (O_EXCL, O_NOFOLLOW, then
/// renamed into place), readable by this user only; returns the path.
[[nodiscard]] expected<std::string> write_token_file(const std::string& token, uint16_t port);

/// The token a scheduler on `port` wrote there and did not remove (it was killed): a
/// scheduler started again on that port takes it up, so the nodes holding it join again.
/// Only a regular file of this user's, readable by no one else, with a token of 32 or more
/// characters counts. Sets `path` to the file when it returns a token.
std::string left_token(uint16_t port, std::string& path);

}  // namespace ashlar::cli
