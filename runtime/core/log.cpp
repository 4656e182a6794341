#include "runtime/core/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace ashlar {

caf::error init_logging(const std::string& level, const std::string& prefix) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    return make_error(errc::invalid_config, "log level '" + level
                                              + "' is not one of trace, debug, info, warn, error, off");
  // A process may run several commands (the Python package runs each in turn): the
  // logger of an earlier one is replaced.
  spdlog::drop("ashlar");
  auto logger = spdlog::stderr_color_mt("ashlar");
  logger->set_level(lvl);
  std::string pattern = "[%H:%M:%S.%e] [%^%l%$] ";
  if (!prefix.empty())
    pattern = "[" + prefix + "] " + pattern;
  logger->set_pattern(pattern + "%v");
  spdlog::set_default_logger(logger);
  return caf::none;
}

}  // namespace ashlar
