#include "runtime/core/error.hpp"

#include <caf/message.hpp>
#include <caf/sec.hpp>

namespace ashlar {

const char* to_string(errc x) {
  switch (x) {
    case errc::none: return "none";
    case errc::invalid_config: return "invalid_config";
    case errc::invalid_argument: return "invalid_argument";
    case errc::io_error: return "io_error";
    case errc::corrupt_data: return "corrupt_data";
    case errc::shape_mismatch: return "shape_mismatch";
    case errc::malformed_message: return "malformed_message";
    case errc::peer_unreachable: return "peer_unreachable";
    case errc::invalid_state: return "invalid_state";
    case errc::numerical_error: return "numerical_error";
    case errc::unknown_name: return "unknown_name";
    case errc::handshake_refused: return "handshake_refused";
    case errc::device_error: return "device_error";
    case errc::cancelled: return "cancelled";
    case errc::unsupported_format: return "unsupported_format";
    case errc::busy: return "busy";
  }
  return "unknown_error";
}

caf::error make_error(errc code, std::string context) {
  return caf::error{static_cast<uint8_t>(code), error_category_atom::value,
                    caf::make_message(std::move(context))};
}

bool is(const caf::error& err, errc code) {
  // An empty error has no category to read (CAF 0.17 dereferences null there).
  return err && err.category() == error_category_atom::value
         && err.code() == static_cast<uint8_t>(code);
}

namespace {

// An error's context as text: make_error's string, or CAF's rendering of anything else.
std::string context_text(const caf::error& err) {
  const auto& msg = err.context();
  if (msg.size() == 1 && msg.match_element<std::string>(0))
    return msg.get_as<std::string>(0);
  return msg.empty() ? std::string{} : to_string(msg);
}

}  // namespace

caf::error located(const caf::error& err, const std::string& where) {
  if (!err || err.category() != error_category_atom::value)
    return err;
  const std::string ctx = context_text(err);
  return make_error(static_cast<errc>(err.code()), ctx.empty() ? where : where + ": " + ctx);
}

std::string describe(const caf::error& err) {
  if (!err)
    return "no error";
  const std::string ctx = context_text(err);
  std::string out;
  if (err.category() == error_category_atom::value)
    out = to_string(static_cast<errc>(err.code()));
  else if (err.category() == caf::atom("system"))
    out = to_string(static_cast<caf::sec>(err.code()));
  else
    out = to_string(err.category()) + ":" + std::to_string(err.code());
  if (!ctx.empty()) {
    out += ": ";
    out += ctx;
  }
  return out;
}

}  // namespace ashlar
