// One copy of a decoded data set per host: the pixels of an IDX file, once decoded, are
// written to the user's cache directory and every process that loads the same file maps
// that copy (read-only, shared pages of the page cache) instead of holding its own. Clean
// file pages, so the kernel can drop and re-read them under memory pressure; nothing is
// left in RAM when the processes end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ashlar {

/// The cache directory: $ASHLAR_CACHE_DIR, else $XDG_CACHE_HOME/ashlar, else
/// $HOME/.cache/ashlar; "" if none is set. "off" in $ASHLAR_CACHE_DIR turns the cache off.
std::string pixel_cache_dir();

/// The pixels decoded from `source` (its IDX header `header` and the bytes after it) as a
/// host-wide shared mapping of the cached copy, written first if there is none; where
/// anything fails (no cache directory, not ours, full, a cached copy of another size),
/// `decoded` itself, owned by this process. The cache is keyed by the source's path,
/// device, inode, size and modification time, and checked: a regular file, not a link,
/// owned by this user, of the expected size, starting with the same header.
std::shared_ptr<const uint8_t> share_pixels(const std::string& source, const uint8_t (&header)[16],
                                            std::vector<uint8_t> decoded);

/// The cached copy of `source`'s `pixels` bytes after `header`, mapped as share_pixels
/// maps it, where one is there (same key, same checks); null otherwise: a process that
/// finds it need not decode the source at all.
std::shared_ptr<const uint8_t> cached_pixels(const std::string& source, const uint8_t (&header)[16], size_t pixels);

}  // namespace ashlar
