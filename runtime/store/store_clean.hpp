// What `ashlar checkpoint clean` may remove of a checkpoint directory. A takeover
// (store_lease.hpp) leaves the generation it took a shard's store from on disk, since the
// process that held it may wake up and write there; once that process is gone, the
// generation is only disk space. So is the working directory of a takeover that did not
// finish. The plan is pure; the checks that no process holds or writes what it names are
// the caller's (store_lock_holder, directory_state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace ashlar {

/// One entry of a checkpoint directory.
struct checkpoint_dir_entry {
  std::string name;   // e.g. "shard-0", "shard-0.1", "shard-0.taking-over-12-34", "job"
  bool link = false;  // a symbolic link
  std::string target; // a link's text
};

/// An entry and why it goes or stays.
struct clean_item {
  std::string name;
  std::string why;
};

struct clean_plan {
  std::vector<clean_item> remove; // if no process holds or writes it
  std::vector<clean_item> keep;
};

/// Of a shard's entries (shard-ID, a link to shard-ID.G): the generations older than the
/// one its link points to, and the working directories of takeovers (shard-ID.taking-over-*),
/// are to be removed. Kept, saying why: generations newer than the link's (a takeover may be
/// moving the link to one now), and every generation and working directory of a shard
/// whose link is missing, is a directory, or points to a generation that is not there (the
/// newest may be the only copy). Entries of other names (the job's store, files a user put
/// there) are not named at all.
clean_plan plan_clean(const std::vector<checkpoint_dir_entry>& entries);

/// The process that holds the RocksDB store in `dir` (the lock on its LOCK file, as this
/// host sees it; 0 where the lock is held from another host or PID namespace), or nothing
/// where none does or the store has no LOCK file. Fails with io_error naming the file.
/// Not for a process that may hold the store itself: POSIX drops every lock a process
/// holds on a file when it closes any descriptor of it, and its own locks read as free.
[[nodiscard]] expected<std::optional<int64_t>> store_lock_holder(const std::string& dir);

/// What a directory holds at one look.
struct directory_snapshot {
  std::string state;  // every file's name, size and modification time, and the store's lease
  uint64_t bytes = 0; // its files' sizes summed
};

/// What `dir` holds now, to compare with a later look (`state`): a process still writing
/// there changes it. Fails with io_error naming the directory.
[[nodiscard]] expected<directory_snapshot> directory_state(const std::string& dir);

}  // namespace ashlar
