// TLS for Ashlar's connections, on OpenSSL: a cluster CA signs one certificate per node,
// and every connection between nodes is mutual TLS (both sides present a certificate the
// cluster's CA signed; a peer without one is refused during the handshake).
//
// A node's TLS directory holds three PEM files, made by `ashlar cert`:
//   ca.pem    the cluster CA's certificate (trust anchor)
//   node.pem  this node's certificate, signed by the CA
//   node.key  this node's private key (unencrypted, mode 0600)
#pragma once

#include <memory>
#include <string>

#include "runtime/core/error.hpp"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace ashlar::net {

/// One loaded set of node credentials; shared by every connection of a process.
class tls_context {
public:
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  /// Loads DIR/ca.pem, DIR/node.pem and DIR/node.key (and makes the process ignore
  /// SIGPIPE: a closed TLS connection fails its write instead). Fails with io_error naming the
  /// file and OpenSSL's reason (missing, unreadable, encrypted key, key not matching the
  /// certificate, certificate not signed by the CA).
  [[nodiscard]] static expected<std::shared_ptr<tls_context>> load(const std::string& dir);

  /// A new session for one connection on `fd` (client or server side of the handshake);
  /// null if OpenSSL cannot allocate one.
  SSL* new_session(int fd, bool server) const;

  /// This node's certificate subject common name.
  const std::string& name() const { return name_; }
  const std::string& dir() const { return dir_; }

private:
  tls_context() = default;
  SSL_CTX* ctx_ = nullptr;
  std::string name_;
  std::string dir_;
};

/// OpenSSL's queued errors as one line (and clears them); "" if none.
std::string tls_error_text();

/// The common name of the peer's certificate on an established session ("" if none).
std::string tls_peer_name(SSL* ssl);

/// Keys for a connection's own record layer, derived from an established TLS session
/// (RFC 5705 exporter): the client's sending key, then the server's. False on failure.
bool tls_export_keys(SSL* ssl, uint8_t (&client_tx)[32], uint8_t (&server_tx)[32]);

/// Creates the cluster CA in `ca_dir` (ca.pem, ca.key; mode 0600 for the key) unless it
/// exists. Returns true if it created one.
[[nodiscard]] expected<bool> ensure_ca(const std::string& ca_dir);

/// Issues a certificate for node `name` signed by the CA in `ca_dir`, writing
/// out_dir/{ca.pem,node.pem,node.key}. Valid for `days` days; usable for both sides of a
/// connection.
[[nodiscard]] caf::error issue_node_cert(const std::string& ca_dir, const std::string& out_dir,
                                         const std::string& name, int days);

}  // namespace ashlar::net
