// `ashlar --version` / `ashlar version`: the version and the build's facts.
#include <string>

#include <caf/config.hpp>
#include <spdlog/version.h>

#include "apps/ashlar/commands.hpp"
#include "ashlar_build_info.hpp"
#include "gpu/cuda_backend.hpp"

namespace ashlar::cli {

namespace {

std::string compiler() {
#if defined(__clang__)
  return std::string{"Clang "} + __clang_version__;
#elif defined(__GNUC__)
  return std::string{"GCC "} + __VERSION__;
#else
  return "an unknown compiler";
#endif
}

}  // namespace

std::string version_text() {
  const int caf = CAF_VERSION; // e.g. 1706 = 0.17.6
  std::string cuda = gpu::built_with_cuda() ? "CUDA on" : "CUDA off (built without the toolkit)";
  std::string type = ASHLAR_BUILD_TYPE;
  return std::string{"ashlar "} + ASHLAR_VERSION + " (commit " + ASHLAR_BUILD_COMMIT + ", " + cuda + ", CAF "
         + std::to_string(caf / 10000) + "." + std::to_string(caf / 100 % 100) + "." + std::to_string(caf % 100)
         + ", spdlog " + std::to_string(SPDLOG_VER_MAJOR) + "." + std::to_string(SPDLOG_VER_MINOR) + ", "
         + (type.empty() ? "no build type" : type + " build") + ", " + compiler() + ")";
}

}  // namespace ashlar::cli
