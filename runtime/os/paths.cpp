#include "runtime/os/paths.hpp"

#include <filesystem>

namespace ashlar {

namespace fs = std::filesystem;

expected<std::string> confine_path(const std::string& root, const std::string& path, const std::string& what) {
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(fs::absolute(root, ec), ec);
  if (ec)
    return make_error(errc::invalid_argument, "cannot resolve the work directory " + root + ": " + ec.message());
  fs::path p{path};
  if (p.is_relative())
    p = base / p;
  const fs::path resolved = fs::weakly_canonical(p.lexically_normal(), ec);
  if (ec)
    return make_error(errc::invalid_argument, what + " " + path + " cannot be resolved: " + ec.message());
  auto rel = resolved.lexically_relative(base);
  if (rel.empty() || *rel.begin() == "..")
    return make_error(errc::invalid_argument, what + " " + path + " lies outside this node's work directory "
                                                + base.string() + " (--work-dir)");
  return resolved.string();
}

}  // namespace ashlar
