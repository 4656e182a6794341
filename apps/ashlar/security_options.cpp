#include "apps/ashlar/security_options.hpp"
#include "runtime/net/token_rules.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>


#include "actors/cluster/system.hpp"
#include "runtime/control/rendezvous.hpp"
#include "runtime/core/number_text.hpp"

#include <spdlog/spdlog.h>

namespace ashlar::cli {

void add_security_options(CLI::App* cmd, security_options& o, bool listens) {
  cmd->add_option("--token-file", o.token_file,
                  "file whose first line is the cluster token (default: $ASHLAR_TOKEN)")
    ->group("Security");
  cmd->add_option("--tls", o.tls_dir,
                  "directory with ca.pem, node.pem, node.key from `ashlar cert`: mutual TLS with the "
                  "cluster's nodes (default: $ASHLAR_TLS_DIR)")
    ->group("Security");
  if (listens)
    cmd->add_flag("--insecure", o.insecure,
                  "listen on a non-loopback address without TLS (the token still authenticates, but "
                  "traffic is readable on the network)")
      ->group("Security");
  cmd->add_option("--max-message-mb", o.max_message_mb,
                  "close a connection whose peer announces a larger message")
    ->capture_default_str()
    ->check(CLI::Range(1.0, 2000.0))
    ->group("Security");
  cmd->add_option("--max-connections-per-address", o.max_per_source,
                  "refuse a connection from an address that holds this many connections already (admitted or "
                  "being admitted)")
    ->capture_default_str()
    ->check(CLI::Range(1, 1 << 20))
    ->group("Security");
  cmd->add_option("--max-in-flight-mb", o.max_in_flight_mb,
                  "the bytes of messages this process receives at once over all its cluster connections (a "
                  "connection whose announcement would pass it is closed), and apart from those the bytes of "
                  "tensors its data plane holds unapplied (a push past it waits) (at least --max-message-mb)")
    ->capture_default_str()
    ->check(CLI::Range(1.0, 65536.0))
    ->group("Security");
}

expected<net::net_security> load_security(const security_options& o) {
  net::net_security sec;
  // A token file others may read is refused as OpenSSH refuses a key; a weak token too.
  if (!o.token_file.empty())
    if (auto err = net::check_token_file(o.token_file))
      return err;
  auto token = actors::load_token(o.token_file, std::getenv("ASHLAR_TOKEN"));
  if (!token)
    return token.error();
  if (!token->empty())
    if (auto err = net::check_token_strength(*token, o.token_file.empty() ? std::string{"$ASHLAR_TOKEN"}
                                                                          : "the token file " + o.token_file))
      return err;
  sec.token = *token;
  std::string dir = o.tls_dir;
  if (dir.empty())
    if (const char* env = std::getenv("ASHLAR_TLS_DIR"))
      dir = env;
  if (!dir.empty()) {
    auto ctx = net::tls_context::load(dir);
    if (!ctx)
      return ctx.error();
    sec.tls = *ctx;
  }
  sec.max_message = static_cast<uint64_t>(o.max_message_mb * 1024 * 1024);
  if (o.max_in_flight_mb < o.max_message_mb)
    return make_error(errc::invalid_argument, "--max-in-flight-mb " + number_text("%g", o.max_in_flight_mb)
                                                + " is below --max-message-mb " + number_text("%g", o.max_message_mb)
                                                + ": no message of the largest size could ever be received");
  sec.max_in_flight = static_cast<uint64_t>(o.max_in_flight_mb * 1024 * 1024);
  sec.max_per_source = o.max_per_source;
  sec.handshake_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.handshake_timeout * 1000));
  return sec;
}

expected<net::net_security> load_security(const security_options& o, const std::string& join) {
  auto sec = load_security(o);
  if (!sec || !sec->token.empty() || sec->tls || !o.token_file.empty())
    return sec;
  const auto colon = join.rfind(':');
  if (colon == std::string::npos)
    return sec;
  const long port = std::strtol(join.c_str() + colon + 1, nullptr, 10);
  if (port <= 0 || port > 65535)
    return sec;
  std::string path;
  auto token = left_token(static_cast<uint16_t>(port), path);
  if (!token.empty()) {
    sec->token = token;
    spdlog::debug("using the cluster token in {}", path);
  }
  return sec;
}

bool is_loopback(const std::string& host) {
  return control::is_loopback_address(host);
}

caf::error check_listen_policy(const std::string& host, const net::net_security& sec, bool insecure,
                               const char* what) {
  if (sec.tls || insecure || is_loopback(host))
    return caf::none;
  return make_error(errc::invalid_argument,
                    std::string{what} + " would listen on " + (host.empty() ? "every interface" : host)
                      + " without TLS: anyone on the network could read the traffic. Give the node "
                        "credentials (--tls DIR, made with `ashlar cert`), listen on 127.0.0.1, or say "
                        "--insecure");
}

std::string join_hint(const security_options& o) {
  std::string out;
  if (!o.token_file.empty())
    out += " --token-file " + o.token_file;
  if (!o.tls_dir.empty())
    out += " --tls DIR";
  return out;
}

std::string make_token() {
  return net::random_hex(32);
}

namespace {

// Where this user's cluster tokens go: $ASHLAR_HOME, else ~/.ashlar, else
// $XDG_RUNTIME_DIR/ashlar; never a shared directory such as /tmp, where another user could
// make the directory first.
expected<std::string> token_dir() {
  if (const char* home = std::getenv("ASHLAR_HOME"); home && *home)
    return std::string{home};
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string{h} + "/.ashlar";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x)
    return std::string{x} + "/ashlar";
  return make_error(errc::invalid_argument, "no private directory for the cluster token: HOME, ASHLAR_HOME and "
                                            "XDG_RUNTIME_DIR are unset. Set ASHLAR_HOME to a directory of your own "
                                            "(mode 700), or give the nodes --token-file");
}

}  // namespace

std::string left_token(uint16_t port, std::string& path) {
  if (port == 0)
    return {};
  auto dir = token_dir();
  if (!dir || net::check_private_dir(*dir, "the cluster token's directory"))
    return {};
  auto file = *dir + "/cluster-" + std::to_string(port) + ".token";
  struct stat st{};
  if (::lstat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid()
      || (st.st_mode & 077) != 0)
    return {};
  auto token = actors::load_token(file, nullptr);
  if (!token || token->size() < 32 || net::check_token_strength(*token, file))
    return {};
  path = file;
  return *token;
}

expected<std::string> private_token_dir() {
  auto dir = token_dir();
  if (!dir)
    return dir.error();
  std::error_code ec;
  const auto parent = std::filesystem::path{*dir}.parent_path();
  if (!parent.empty())
    std::filesystem::create_directories(parent, ec);
  if (::mkdir(dir->c_str(), 0700) != 0 && errno != EEXIST)
    return make_error(errc::io_error, "cannot create " + *dir + " for the cluster token: " + std::strerror(errno));
  // This user's own directory, readable by others: made private. Anyone else's, a link, or
  // one others may write is refused (check_private_dir says why and what to do).
  struct stat st{};
  if (::lstat(dir->c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid() && (st.st_mode & 077) != 0
      && (st.st_mode & 022) == 0)
    ::chmod(dir->c_str(), 0700);
  if (auto err = net::check_private_dir(*dir, "the cluster token's directory"))
    return err;
  return dir;
}

expected<std::string> write_token_file(const std::string& token, uint16_t port) {
  auto dir = private_token_dir();
  if (!dir)
    return dir.error();
  auto path = *dir + "/cluster-" + std::to_string(port) + ".token";
  auto tmp = path + ".tmp";
  // A file of this name is never written through (it may be a link planted there): made anew.
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(errc::io_error, "cannot write the cluster token to " + tmp + ": " + std::strerror(errno));
  auto line = token + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ok = ::close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(errc::io_error, "cannot write the cluster token to " + path + ": " + std::strerror(errno));
  return path;
}

}  // namespace ashlar::cli
