// Keeping the files a remote request asks a node to write inside that node's own
// directory.
#pragma once

#include <memory>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// `path` resolved under `root`: a relative path is taken from root; an absolute one must
/// already lie inside it. ".." and symbolic links are resolved before the check, so
/// neither leads out. Fails with invalid_argument naming `what`, the path and the root.
[[nodiscard]] expected<std::string> confine_path(const std::string& root, const std::string& path,
                                                 const std::string& what);

/// Opens `path` at the moment of use. With `root` empty, as given (the operator's own
/// paths). Otherwise beneath root: openat2 with RESOLVE_BENEATH from a descriptor of root,
/// so neither ".." nor a symbolic link (one planted after the job was checked included)
/// leads out; an absolute path must name a place inside root. `flags` as for open(2)
/// (O_CLOEXEC is added). Fails with invalid_argument (outside root) or io_error, naming
/// `what` and the path as given; an error says nothing of what exists outside root.
[[nodiscard]] expected<int> open_confined(const std::string& root, const std::string& path, int flags,
                                          const std::string& what, unsigned mode = 0644);

/// A directory held open: path() (/proc/self/fd/N) names that very directory for as long
/// as this lives, whatever is renamed or linked on the way to it since it was opened.
class pinned_dir {
public:
  pinned_dir() = default;
  explicit pinned_dir(int fd) : fd_(fd) {}
  ~pinned_dir();
  pinned_dir(pinned_dir&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  pinned_dir& operator=(pinned_dir&& o) noexcept;
  pinned_dir(const pinned_dir&) = delete;
  pinned_dir& operator=(const pinned_dir&) = delete;
  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  std::string path() const;
  /// `text`, or an Ashlar error's context, with path() in it written as `as` (the
  /// directory as the user named it).
  std::string named(std::string text, const std::string& as) const;
  caf::error named(const caf::error& err, const std::string& as) const;

private:
  int fd_ = -1;
};

/// The directory `path` beneath `root` (as open_confined takes it), made where missing
/// (mode 0755), each component opened from the one before without following a symbolic
/// link, and held open. One pin per directory in a process while any caller holds it:
/// RocksDB knows the stores this process has open by their paths, so two opens of one
/// store through two pins would not see each other. Fails with invalid_argument where a
/// link or ".." is on the way or the path lies outside root, io_error otherwise, naming
/// `what` and the path as given.
[[nodiscard]] expected<std::shared_ptr<pinned_dir>> pin_confined_dir(const std::string& root,
                                                                     const std::string& path,
                                                                     const std::string& what);

/// The whole content of a regular file of at most `limit` bytes, opened by open_confined:
/// a device, a FIFO, a directory or a larger file fails before more than `limit` bytes are
/// read.
[[nodiscard]] expected<std::string> read_small_file(const std::string& root, const std::string& path,
                                                    size_t limit, const std::string& what);

/// Checks before any work starts that a file can be written at `path` later: its
/// directory exists and is writable, and the path is not a directory (nor an existing
/// file that cannot be written). Fails with io_error naming `key` and the path.
[[nodiscard]] caf::error check_output_file(const std::string& path, const std::string& key);

}  // namespace ashlar
