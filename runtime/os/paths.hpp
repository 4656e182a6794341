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

}  // namespace ashlar
