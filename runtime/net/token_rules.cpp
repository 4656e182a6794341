#include "runtime/net/token_rules.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

namespace ashlar::net {

namespace {

std::string octal(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

} // namespace

double token_entropy_bits(const std::string& token) {
  if (token.empty())
    return 0;
  bool hex = true, b64 = true;
  std::map<char, size_t> seen;
  for (char c : token) {
    const auto u = static_cast<unsigned char>(c);
    hex = hex && (std::isdigit(u) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'));
    b64 = b64 && (std::isalnum(u) || c == '+' || c == '/' || c == '-' || c == '_' || c == '=');
    ++seen[c];
  }
  size_t most = 0;
  for (const auto& [c, n] : seen)
    most = std::max(most, n);
  if (seen.size() < 8 || most * 4 > token.size())
    return 0;
  const double per_char = hex ? 4.0 : b64 ? 6.0 : std::log2(95.0);
  return per_char * static_cast<double>(token.size());
}

caf::error check_token_strength(const std::string& token, const std::string& from) {
  const double bits = token_entropy_bits(token);
  if (bits >= min_token_bits)
    return caf::none;
  return make_error(errc::invalid_argument,
                    from + " holds a token of at most " + std::to_string(static_cast<int>(bits))
                      + " bits, under the 128 a cluster token needs (" + std::to_string(token.size())
                      + " characters): anyone who sees one handshake could guess it offline. Use a generated one: "
                        "`ashlar node --role scheduler` makes one, or `head -c 32 /dev/urandom | base64`");
}

caf::error check_token_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    return make_error(errc::io_error, "cannot read token file " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return make_error(errc::invalid_argument, "token file " + path + " is not a regular file");
  if ((st.st_mode & 077) != 0)
    return make_error(errc::invalid_argument, "token file " + path + " may be read or written by others (mode "
                                                + octal(st.st_mode) + "), as a private key must not: `chmod 600 "
                                                + path + "`, then start again");
  return caf::none;
}

caf::error check_private_dir(const std::string& dir, const std::string& what) {
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0)
    return make_error(errc::io_error, "cannot use " + dir + " (" + what + "): " + std::strerror(errno));
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode))
    return make_error(errc::invalid_argument, dir + " (" + what + ") is " + (S_ISLNK(st.st_mode) ? "a link" : "not a directory")
                                                + ": a token there could be read elsewhere. Point ASHLAR_HOME at a "
                                                  "directory of your own");
  if (st.st_uid != ::getuid())
    return make_error(errc::invalid_argument, dir + " (" + what + ") belongs to user " + std::to_string(st.st_uid)
                                                + ", not to you (" + std::to_string(::getuid())
                                                + "): whoever made it could read the token. Point ASHLAR_HOME at "
                                                  "a directory of your own");
  if ((st.st_mode & 022) != 0)
    return make_error(errc::invalid_argument, dir + " (" + what + ") may be written by others (mode " + octal(st.st_mode)
                                                + "): they could plant or swap the token. `chmod 700 " + dir
                                                + "`, or point ASHLAR_HOME at a directory of your own");
  return caf::none;
}

}  // namespace ashlar::net
