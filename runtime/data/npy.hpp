// NumPy's file formats: .npy arrays (read and written) and .npz archives of them
// (written), the formats any Python user reads with numpy.load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// One .npy array: its dtype ("<f4", "|u1", "<i8", ...), shape and raw bytes (in the
/// file's byte order; only little-endian and single-byte types are accepted).
struct npy_array {
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

/// Reads a .npy file (format versions 1-3), checking the magic, the header and that the
/// data's length matches the shape. Errors (io_error, corrupt_data) name the path.
[[nodiscard]] expected<npy_array> read_npy(const std::string& path);

/// The bytes of a .npy file (format 1.0) holding `a`.
std::vector<uint8_t> npy_bytes(const npy_array& a);

/// Writes a .npz archive (an uncompressed zip) whose entries are NAME.npy for each named
/// array; numpy.load(path)[NAME] reads them back. Errors: io_error naming the path, or
/// invalid_argument past the zip format's 4 GiB.
[[nodiscard]] caf::error write_npz(const std::string& path,
                                   const std::vector<std::pair<std::string, npy_array>>& entries);

}  // namespace ashlar
