// Keeping the files a remote request asks a node to write inside that node's own
// directory.
#pragma once

#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// `path` resolved under `root`: a relative path is taken from root; an absolute one must
/// already lie inside it. ".." and symbolic links are resolved before the check, so
/// neither leads out. Fails with invalid_argument naming `what`, the path and the root.
[[nodiscard]] expected<std::string> confine_path(const std::string& root, const std::string& path,
                                                 const std::string& what);

/// Checks before any work starts that a file can be written at `path` later: its
/// directory exists and is writable, and the path is not a directory (nor an existing
/// file that cannot be written). Fails with io_error naming `key` and the path.
[[nodiscard]] caf::error check_output_file(const std::string& path, const std::string& key);

}  // namespace ashlar
