// Ashlar's error vocabulary: caf::error values in the "ashlar" category, with a
// human-readable context string naming what failed and where.
#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

namespace ashlar {

/// Error codes of the "ashlar" error category. Values are stable: they cross the wire.
enum class errc : uint8_t {
  /// Not an error.
  none = 0,
  /// A configuration value, key or combination is invalid (names the key).
  invalid_config = 1,
  /// A command-line argument is invalid or unknown.
  invalid_argument = 2,
  /// A file could not be opened, read or written (names the path).
  io_error = 3,
  /// A data file exists but its content is malformed: bad magic, truncated, wrong size.
  corrupt_data = 4,
  /// A tensor or message has a shape or length other than the receiver expects.
  shape_mismatch = 5,
  /// A wire message could not be decoded (malformed, truncated, wrong schema).
  malformed_message = 6,
  /// A peer did not answer or could not be reached (names the address).
  peer_unreachable = 7,
  /// The operation is not valid in the current state (e.g. push to a finished job).
  invalid_state = 8,
  /// A numerical failure: NaN or infinity in a loss or gradient.
  numerical_error = 9,
  /// A name (policy, dataset, backend) is not known to its registry.
  unknown_name = 10,
  /// Handshake refused: protocol version or cluster token mismatch.
  handshake_refused = 11,
  /// A GPU device, driver or library call failed (names the call, file and line).
  device_error = 12,
  /// A computation its owner gave up (a host application's backend that stops taking
  /// steps): not a failure; the worker leaves as if removed.
  cancelled = 13,
  /// A stored record is in a format newer than this build reads (names the record, its
  /// format and the newest this build knows): never passed over as corrupt, never
  /// deleted, so that the build that wrote it can still resume from it.
  unsupported_format = 14,
  /// A resource another process holds for now (a checkpoint store's lock): the same
  /// request may succeed later.
  busy = 15,
};

/// The atom that marks Ashlar's error category.
using error_category_atom = caf::atom_constant<caf::atom("ashlar")>;

/// The name of an error code, e.g. "io_error".
const char* to_string(errc x);

/// Makes an Ashlar error. `context` should say what failed, where, and what to do.
caf::error make_error(errc code, std::string context);

/// Renders any caf::error for a user: Ashlar errors as "io_error: <context>",
/// others through CAF's default rendering.
std::string describe(const caf::error& err);

/// The Ashlar error `err` with `where` put before its context ("<where>: <context>"),
/// its code kept; any other error as it is.
caf::error located(const caf::error& err, const std::string& where);

/// True if `err` is the Ashlar error `code`.
bool is(const caf::error& err, errc code);

template <class T>
using expected = caf::expected<T>;

}  // namespace ashlar
