#include "runtime/store/store_clean.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "runtime/store/store_lease.hpp"

namespace ashlar {

clean_plan plan_clean(const std::vector<checkpoint_dir_entry>& entries) {
  // Per shard (by its link's name): the link, its generations, takeovers' directories.
  struct shard_entries {
    const checkpoint_dir_entry* link = nullptr;
    bool directory = false; // shard-ID is a directory: the layout before generations, or a copy that followed links
    std::map<uint32_t, std::string> generations; // directories, by number
    std::vector<std::string> takeovers;
  };
  std::map<std::string, shard_entries> shards;
  for (const auto& e : entries) {
    if (shard_link_id(e.name)) {
      if (e.link)
        shards[e.name].link = &e;
      else
        shards[e.name].directory = true;
      continue;
    }
    const auto dot = e.name.find('.');
    if (dot == std::string::npos || !shard_link_id(e.name.substr(0, dot)) || e.link)
      continue;
    const auto base = e.name.substr(0, dot);
    if (auto g = generation_in(e.name, base))
      shards[base].generations[g] = e.name;
    else if (e.name.compare(dot + 1, 12, "taking-over-") == 0)
      shards[base].takeovers.push_back(e.name);
  }
  clean_plan plan;
  for (const auto& [base, s] : shards) {
    const uint32_t linked = s.link ? generation_in(s.link->target, base) : 0;
    const bool linked_there = linked != 0 && s.generations.count(linked) > 0;
    // Without a usable link nothing of the shard is removed: which copy a resume reads is
    // not this plan's to judge.
    const std::string unusable =
      s.directory ? base + " is a directory (the layout before generations, or a copy that followed the links): it "
                           "becomes the next generation when opened"
      : !s.link   ? base + " has no link: its newest generation is what a resume reads"
                  : base + " points to '" + s.link->target + "', which is not a generation here";
    for (const auto& t : s.takeovers) {
      if (linked_there)
        plan.remove.push_back({t, "the working copy of a takeover of " + base + " that was never claimed"});
      else
        plan.keep.push_back({t, unusable});
    }
    for (const auto& [g, name] : s.generations) {
      if (!linked_there) {
        plan.keep.push_back({name, unusable});
      } else if (g < linked) {
        plan.remove.push_back({name, "generation " + std::to_string(g) + " of " + base + ", which points to generation "
                                       + std::to_string(linked) + " since a takeover"});
      } else if (g > linked) {
        plan.keep.push_back({name, "newer than generation " + std::to_string(linked) + ", which " + base
                                     + " points to (a takeover may be moving the link to it now)"});
      }
    }
  }
  return plan;
}

expected<std::optional<int64_t>> store_lock_holder(const std::string& dir) {
  const auto path = dir + "/LOCK";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return std::optional<int64_t>{};
    return make_error(errc::io_error, "cannot open the store's lock file " + path + ": " + std::strerror(errno));
  }
  struct flock lock {};
  lock.l_type = F_WRLCK; // would a writer's lock conflict: is any lock held?
  lock.l_whence = SEEK_SET;
  lock.l_start = 0;
  lock.l_len = 0;
  const int rc = ::fcntl(fd, F_GETLK, &lock);
  const int err = errno;
  ::close(fd);
  if (rc < 0)
    return make_error(errc::io_error, "cannot query the lock on " + path + ": " + std::strerror(err));
  if (lock.l_type == F_UNLCK)
    return std::optional<int64_t>{};
  return std::optional<int64_t>{static_cast<int64_t>(lock.l_pid)};
}

expected<directory_snapshot> directory_state(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  directory_snapshot out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it{dir, ec}, end; !ec && it != end; it.increment(ec)) {
    std::error_code fe;
    if (!it->is_regular_file(fe))
      continue;
    const auto size = it->file_size(fe);
    const auto time = it->last_write_time(fe);
    if (fe)
      continue; // gone meanwhile: the next look differs anyway
    out.bytes += size;
    files.push_back(it->path().string() + " " + std::to_string(size) + " "
                    + std::to_string(time.time_since_epoch().count()));
  }
  if (ec)
    return make_error(errc::io_error, "cannot list " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  for (const auto& f : files)
    out.state += f + "\n";
  auto lease = read_lease(dir);
  if (!lease)
    return lease.error();
  if (*lease)
    out.state += "lease: " + **lease;
  return out;
}

}  // namespace ashlar
