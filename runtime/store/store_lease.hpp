// The lease of a checkpoint store. RocksDB's lock says only that some process holds a
// store; the lease says whether that process still runs. While a process holds a shard's
// store, a thread of its own rewrites a small file in the store's directory (a renewal
// count) every half second. A node asked to serve a lost shard again from a store whose
// lock is still held watches that file across its tries (the cluster asks again every
// 2 s): a lease unchanged for lease_stale_s belongs to a process that is frozen or hung
// (SIGSTOP, a machine that stopped scheduling it) and will not let go, and the store is
// taken over. Nothing compares clocks: a holder on another host renews by its own count,
// and the watcher measures on its own steady clock how long it has seen no change.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/store/kv_store.hpp"

namespace ashlar {

/// The lease's file in a store's directory (RocksDB leaves files it does not know alone).
constexpr const char* lease_file_name = "ashlar-lease";

/// Seconds a held store's lease must stay unchanged before the store is taken over: past
/// the 3 s heartbeat timeout after which the cluster gave up on the holder's node, and
/// twelve renewals of a holder that runs.
constexpr double lease_stale_s = 6.0;

/// A held lease: renewed from a thread of its own until destroyed. Renewals go through
/// the file opened when the lease was taken, so after a takeover moved the store's
/// directory aside, a holder that wakes up renews the moved one, never its successor's.
class store_lease {
public:
  /// Writes the lease into `dir` (the store's directory, which must exist) for `holder`
  /// (who holds it, for messages: "node NAME, pid P on HOST") and renews it every
  /// `renew_ms`. Fails with io_error naming the file.
  [[nodiscard]] static expected<std::unique_ptr<store_lease>> take(const std::string& dir, std::string holder,
                                                                   int renew_ms = 500);
  ~store_lease();
  store_lease(const store_lease&) = delete;
  store_lease& operator=(const store_lease&) = delete;

  const std::string& holder() const { return holder_; }
  /// Renewals written so far.
  uint64_t renewals() const;

private:
  store_lease(int fd, std::string holder, int renew_ms);
  void write_lease(); // with mu_ held
  int fd_;
  std::string holder_;
  int renew_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t count_ = 0;
  std::thread renewer_;
};

/// "pid P on HOST": this process, as a lease names its holder where the caller has no
/// better name.
std::string default_lease_holder();

/// The lease in `dir` as it reads now, or nothing if the directory has none (a store no
/// process of this build held, or none holds). Fails with io_error naming the file.
[[nodiscard]] expected<std::optional<std::string>> read_lease(const std::string& dir);

/// Who holds the lease, from its content (its first line).
std::string lease_holder(const std::string& content);

/// Watches the leases of held stores across tries to open them. Pure: the caller reads
/// the lease and its steady clock.
class lease_watch {
public:
  struct verdict {
    bool stale = false;      // unchanged for at least stale_s: take the store over
    double unchanged_s = 0;  // how long this watcher has seen it unchanged
  };
  /// The lease of the store at `dir` read `content` at `now_s` (a steady clock, seconds).
  /// A lease seen for the first time, or changed since last seen, starts a new wait.
  verdict observe(const std::string& dir, const std::string& content, double now_s,
                  double stale_s = lease_stale_s);
  /// Forgets `dir` (opened, or taken over): a later lock there starts a new wait.
  void forget(const std::string& dir) { seen_.erase(dir); }

private:
  struct seen {
    std::string content;
    double since_s = 0;
  };
  std::map<std::string, seen> seen_;
};

/// A shard's checkpoint store lives in generations: DIR/shard-ID is a link to
/// DIR/shard-ID.G, the store itself, and a takeover makes generation G + 1 and moves the
/// link. A holder opens its store by its generation's own path, so that after a takeover
/// it can only ever write into its own generation (RocksDB makes each new file from the
/// path it was opened with); readers open the link and see the newest.
struct store_generation {
  std::string link;        // DIR/shard-ID
  std::string path;        // DIR/shard-ID.G
  uint32_t generation = 0; // G
};

/// ID where `name` is a shard store's link name, "shard-ID" (ID of at most 9 digits),
/// else nothing.
std::optional<uint32_t> shard_link_id(const std::string& name);

/// G where `name` is "BASE.G" (G of at most 9 digits, not 0), else 0: which generation of
/// the store whose link is named BASE a directory (or a link's text) is.
uint32_t generation_in(const std::string& name, const std::string& base);

/// The generation `link` points to. Without a link: generation 1 where there is none yet
/// (the link made; the store is created by its first open), or the newest generation
/// directory beside it (a copy of the checkpoint directory that dropped its links). A
/// store in a directory at `link` (the layout before generations, or a copy that followed
/// the links and so holds the newest records) becomes the generation after the newest,
/// behind a new link, when no process holds it. Renames are synced. Fails with io_error
/// naming the path, busy where such a directory's store is held (it cannot be moved
/// while a process writes into it).
[[nodiscard]] expected<store_generation> store_generation_of(const std::string& link);

/// A store taken over: the new store, its generation, and where the old one stays.
struct taken_over_store {
  std::unique_ptr<kv_store> store;
  store_generation now;
  std::string abandoned;
};

/// Takes over the store behind `link`, whose lock a process that no longer runs still
/// holds: its records (read through a read-only open, which takes no lock) are copied
/// into a new store in a directory of this process's own, written and synced, which then
/// becomes the generation after the newest in one rename (which fails, with busy, where
/// another process claimed that generation first), and the link is moved to it. The old
/// generation stays where it is (its holder, should it wake up, writes there). Fails with
/// io_error naming the step and the path; the link moves only once the new store is
/// complete.
/// `shown_link`: the link as messages and the store's where() name it, where `link` is
/// reached another way (a held directory, pin_confined_dir); default: `link`.
[[nodiscard]] expected<taken_over_store> take_over_store(const std::string& link, const std::string& shown_link = {});

}  // namespace ashlar
