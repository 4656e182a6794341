// What a cluster token and the files that hold it must be, on a host other users share:
//
//   - a token holds at least 128 bits: its length times the bits a character of its
//     alphabet carries (4 for hex, 6 for base64's letters, digits, '+', '/', '-', '_', '=',
//     6.5 for any other printable text), and no run of sameness: at least 8 distinct
//     characters, none more than a quarter of it. A generated token (64 hex characters,
//     `ashlar node --role scheduler` makes one; `head -c 32 /dev/urandom | base64`) passes;
//     a word, a short string or "aaaa..." does not.
//   - a token file is one others can neither read nor write (mode & 077 == 0), as OpenSSH
//     refuses a key file; a link is followed (a Kubernetes Secret's file is one).
//   - a directory tokens are written to is this user's own, not a link, and not writable
//     by others (one another user made first, in /tmp say, is refused: that user could
//     read what is written there).
#pragma once

#include <string>

#include "runtime/core/error.hpp"

namespace ashlar::net {

/// The most bits of entropy the text `token` can hold, by the rule above (0 for a token
/// with too few distinct characters or one repeated too often).
double token_entropy_bits(const std::string& token);

constexpr double min_token_bits = 128;

/// Refuses a token under min_token_bits; `from` names where it came from ("the token file
/// F", "$ASHLAR_TOKEN"). The error says how to make a strong one.
[[nodiscard]] caf::error check_token_strength(const std::string& token, const std::string& from);

/// Refuses a token file others may read or write, or one that is not a regular file,
/// naming it and the chmod that mends it.
[[nodiscard]] caf::error check_token_file(const std::string& path);

/// Refuses `dir` as a place for tokens unless it is a directory (not a link) owned by
/// this user that others cannot write; `what` names its role in the message.
[[nodiscard]] caf::error check_private_dir(const std::string& dir, const std::string& what);

}  // namespace ashlar::net
