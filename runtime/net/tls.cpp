#include "runtime/net/tls.hpp"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ashlar::net {

namespace fs = std::filesystem;

std::string tls_error_text() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    // "error:0A000086:SSL routines::certificate verify failed" -> the reason only.
    std::string s = buf;
    auto colon = s.rfind(':');
    if (colon != std::string::npos)
      s = s.substr(colon + 1);
    if (out.find(s) == std::string::npos)
      out += (out.empty() ? "" : "; ") + s;
  }
  return out;
}

namespace {

// A passphrase callback that offers none: an encrypted key fails to load instead of
// prompting on the terminal.
int no_passphrase(char*, int, int, void*) {
  return 0;
}

std::string subject_name(X509* cert) {
  if (!cert)
    return {};
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof buf);
  return buf;
}

} // namespace

std::string tls_peer_name(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  auto name = subject_name(cert);
  X509_free(cert);
  return name;
}

bool tls_export_keys(SSL* ssl, uint8_t (&client_tx)[32], uint8_t (&server_tx)[32]) {
  static const char label[] = "EXPORTER-ashlar-data-plane";
  uint8_t out[64];
  if (SSL_export_keying_material(ssl, out, sizeof out, label, sizeof label - 1, nullptr, 0, 0) != 1)
    return false;
  std::memcpy(client_tx, out, 32);
  std::memcpy(server_tx, out + 32, 32);
  OPENSSL_cleanse(out, sizeof out);
  return true;
}

tls_context::~tls_context() {
  SSL_CTX_free(ctx_);
}

expected<std::shared_ptr<tls_context>> tls_context::load(const std::string& dir) {
  const std::string ca = dir + "/ca.pem", cert = dir + "/node.pem", key = dir + "/node.key";
  for (const auto& f : {ca, cert, key})
    if (!fs::exists(f))
      return make_error(errc::io_error, "TLS directory " + dir + " has no " + fs::path(f).filename().string()
                                          + " (make one with `ashlar cert --ca CA_DIR --out " + dir
                                          + " --name NAME`)");
  // OpenSSL writes to its sockets with write(2): a peer that closed would end the process
  // with SIGPIPE instead of failing the write.
  static const bool no_sigpipe = [] {
    std::signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void) no_sigpipe;
  ERR_clear_error();
  std::shared_ptr<tls_context> out{new tls_context};
  out->dir_ = dir;
  out->ctx_ = SSL_CTX_new(TLS_method());
  if (!out->ctx_)
    return make_error(errc::io_error, "cannot create a TLS context: " + tls_error_text());
  SSL_CTX* ctx = out->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1)
    return make_error(errc::io_error, "cannot load the certificate " + cert + ": " + tls_error_text());
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1)
    return make_error(errc::io_error, "cannot load the private key " + key
                                        + " (an encrypted key is not supported): " + tls_error_text());
  if (SSL_CTX_check_private_key(ctx) != 1)
    return make_error(errc::io_error, "the private key " + key + " does not belong to the certificate " + cert
                                        + ": " + tls_error_text());
  if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1)
    return make_error(errc::io_error, "cannot load the CA certificate " + ca + ": " + tls_error_text());
  // Both sides present a certificate the cluster CA signed; anything else ends the
  // handshake.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_verify_depth(ctx, 4);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // No TLS 1.3 session tickets: after the handshake nothing but the application's bytes
  // follows (a data connection hands its keys to its own record layer then).
  SSL_CTX_set_num_tickets(ctx, 0);
  // Our own certificate must verify against the CA too: a node given another cluster's
  // certificate learns it now, not from every peer's refusal.
  X509* mine = SSL_CTX_get0_certificate(ctx);
  X509_STORE_CTX* check = X509_STORE_CTX_new();
  X509_STORE_CTX_init(check, SSL_CTX_get_cert_store(ctx), mine, nullptr);
  int ok = X509_verify_cert(check);
  int why = X509_STORE_CTX_get_error(check);
  X509_STORE_CTX_free(check);
  if (ok != 1)
    return make_error(errc::io_error, "the certificate " + cert + " does not verify against " + ca + ": "
                                        + X509_verify_cert_error_string(why));
  out->name_ = subject_name(mine);
  return out;
}

SSL* tls_context::new_session(int fd, bool server) const {
  SSL* ssl = SSL_new(ctx_);
  if (!ssl)
    return nullptr;
  SSL_set_fd(ssl, fd);
  if (server)
    SSL_set_accept_state(ssl);
  else
    SSL_set_connect_state(ssl);
  return ssl;
}

namespace {

struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct x509_free {
  void operator()(X509* p) const { X509_free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;

caf::error write_pem(const std::string& path, bool secret, const std::function<int(BIO*)>& write) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, secret ? 0600 : 0644);
  if (fd < 0)
    return make_error(errc::io_error, "cannot write " + path + ": " + std::strerror(errno));
  BIO* bio = BIO_new_fd(fd, BIO_CLOSE);
  int ok = bio ? write(bio) : 0;
  BIO_free(bio);
  if (ok != 1 || std::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(errc::io_error, "cannot write " + path + ": " + tls_error_text());
  return caf::none;
}

caf::error write_key(const std::string& path, EVP_PKEY* key) {
  return write_pem(path, true,
                   [&](BIO* b) { return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr); });
}

caf::error write_cert(const std::string& path, X509* cert) {
  return write_pem(path, false, [&](BIO* b) { return PEM_write_bio_X509(b, cert); });
}

caf::error add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &v3, nid, value);
  if (!ext)
    return make_error(errc::invalid_argument, std::string{"bad certificate extension "} + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return caf::none;
}

// A certificate for `key`, named `name`, valid `days` days, signed by (issuer, issuer_key)
// or by itself when issuer is null.
expected<x509_ptr> make_cert(EVP_PKEY* key, const std::string& name, int days, X509* issuer, EVP_PKEY* issuer_key,
                             bool ca) {
  x509_ptr cert{X509_new()};
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("Ashlar cluster"),
                             -1, -1, 0);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(name.c_str()), -1,
                             -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : subject);
  X509* signer = issuer ? issuer : cert.get();
  caf::error err;
  if (ca) {
    err = add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    if (!err)
      err = add_ext(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    err = add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    if (!err)
      err = add_ext(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyEncipherment");
    if (!err)
      err = add_ext(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
    if (!err)
      err = add_ext(cert.get(), signer, NID_subject_alt_name, ("DNS:" + name).c_str());
  }
  if (!err)
    err = add_ext(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (err)
    return err;
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0)
    return make_error(errc::io_error, "cannot sign the certificate for " + name + ": " + tls_error_text());
  return cert;
}

expected<pkey_ptr> read_key(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f)
    return make_error(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  pkey_ptr key{PEM_read_PrivateKey(f, nullptr, no_passphrase, nullptr)};
  std::fclose(f);
  if (!key)
    return make_error(errc::io_error, "cannot read the private key " + path + ": " + tls_error_text());
  return key;
}

expected<x509_ptr> read_cert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f)
    return make_error(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  x509_ptr cert{PEM_read_X509(f, nullptr, nullptr, nullptr)};
  std::fclose(f);
  if (!cert)
    return make_error(errc::io_error, "cannot read the certificate " + path + ": " + tls_error_text());
  return cert;
}

caf::error make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create " + dir + ": " + ec.message());
  return caf::none;
}

} // namespace

expected<bool> ensure_ca(const std::string& ca_dir) {
  const std::string cert_path = ca_dir + "/ca.pem", key_path = ca_dir + "/ca.key";
  if (fs::exists(cert_path) && fs::exists(key_path))
    return false;
  if (fs::exists(cert_path) || fs::exists(key_path))
    return make_error(errc::io_error, ca_dir + " has only one of ca.pem and ca.key; remove it or restore the other");
  if (auto err = make_dir(ca_dir))
    return err;
  ::chmod(ca_dir.c_str(), 0700);
  pkey_ptr key{EVP_EC_gen("P-256")};
  if (!key)
    return make_error(errc::io_error, "cannot make a key: " + tls_error_text());
  auto cert = make_cert(key.get(), "Ashlar cluster CA", 3650, nullptr, nullptr, true);
  if (!cert)
    return cert.error();
  if (auto err = write_key(key_path, key.get()))
    return err;
  if (auto err = write_cert(cert_path, cert->get()))
    return err;
  return true;
}

caf::error issue_node_cert(const std::string& ca_dir, const std::string& out_dir, const std::string& name,
                           int days) {
  if (name.empty() || name.size() > 64)
    return make_error(errc::invalid_argument, "a certificate name must have 1 to 64 characters");
  auto ca_key = read_key(ca_dir + "/ca.key");
  if (!ca_key)
    return ca_key.error();
  auto ca_cert = read_cert(ca_dir + "/ca.pem");
  if (!ca_cert)
    return ca_cert.error();
  if (auto err = make_dir(out_dir))
    return err;
  pkey_ptr key{EVP_EC_gen("P-256")};
  if (!key)
    return make_error(errc::io_error, "cannot make a key: " + tls_error_text());
  auto cert = make_cert(key.get(), name, days, ca_cert->get(), ca_key->get(), false);
  if (!cert)
    return cert.error();
  if (auto err = write_key(out_dir + "/node.key", key.get()))
    return err;
  if (auto err = write_cert(out_dir + "/node.pem", cert->get()))
    return err;
  if (fs::weakly_canonical(out_dir) != fs::weakly_canonical(ca_dir))
    if (auto err = write_cert(out_dir + "/ca.pem", ca_cert->get()))
      return err;
  return caf::none;
}

}  // namespace ashlar::net
