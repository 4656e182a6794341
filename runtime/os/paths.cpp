#include "runtime/os/paths.hpp"

#include <filesystem>

#include <unistd.h>

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

caf::error check_output_file(const std::string& path, const std::string& key) {
  std::error_code ec;
  const fs::path p{path};
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path{"."};
  auto fail = [&](const std::string& why) {
    return make_error(errc::io_error, key + ": cannot write " + path + ": " + why);
  };
  if (fs::is_directory(p, ec))
    return fail("it is a directory");
  if (!fs::is_directory(dir, ec))
    return fail("the directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    return fail("the directory " + dir.string() + " is not writable");
  if (fs::exists(p, ec) && ::access(p.c_str(), W_OK) != 0)
    return fail("the file is not writable");
  return caf::none;
}

}  // namespace ashlar
