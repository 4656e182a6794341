#include "runtime/core/clock.hpp"
#include "runtime/store/store_lease.hpp"

#include "runtime/os/subprocess.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace ashlar {

namespace {

std::string lease_path(const std::string& dir) {
  return dir + "/" + lease_file_name;
}

}  // namespace

expected<std::unique_ptr<store_lease>> store_lease::take(const std::string& dir, std::string holder, int renew_ms) {
  const auto path = lease_path(dir);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return make_error(errc::io_error, "cannot write the store's lease " + path + ": " + std::strerror(errno));
  std::unique_ptr<store_lease> lease{new store_lease(fd, std::move(holder), renew_ms)};
  {
    std::lock_guard<std::mutex> lock{lease->mu_};
    lease->write_lease();
  }
  try {
    lease->renewer_ = std::thread{[l = lease.get()] {
      std::unique_lock<std::mutex> lock{l->mu_};
      while (!l->cv_.wait_for(lock, std::chrono::milliseconds(l->renew_ms_), [l] { return l->stop_; }))
        l->write_lease();
    }};
  } catch (const std::system_error& e) {
    return make_error(errc::io_error, "cannot start the thread that renews the store's lease " + path + ": "
                                        + e.what());
  }
  return lease;
}

store_lease::store_lease(int fd, std::string holder, int renew_ms)
  : fd_(fd), holder_(std::move(holder)), renew_ms_(renew_ms) {}

store_lease::~store_lease() {
  {
    std::lock_guard<std::mutex> lock{mu_};
    stop_ = true;
  }
  cv_.notify_all();
  if (renewer_.joinable())
    renewer_.join();
  ::close(fd_);
}

uint64_t store_lease::renewals() const {
  std::lock_guard<std::mutex> lock{mu_};
  return count_;
}

void store_lease::write_lease() {
  ++count_;
  // The count only grows, and with it the text: each write covers the last one whole.
  const std::string text = holder_ + "\nrenewal " + std::to_string(count_) + "\n";
  // A failed renewal (a full disk) is not an error of the holder's: it only lets the
  // lease look stale sooner, which matters only while its lock is in question.
  if (::pwrite(fd_, text.data(), text.size(), 0) < 0)
    return;
  // Synced, so that on a file system shared between hosts (NFS) the others see it.
  (void)::fdatasync(fd_);
}

expected<std::optional<std::string>> read_lease(const std::string& dir) {
  const auto path = lease_path(dir);
  std::ifstream in{path, std::ios::binary};
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      return std::optional<std::string>{};
    return make_error(errc::io_error, "cannot read the store's lease " + path);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return std::optional<std::string>{text.str()};
}

std::string default_lease_holder() {
  return "pid " + std::to_string(::getpid()) + " on " + host_name();
}

std::string lease_holder(const std::string& content) {
  return content.substr(0, content.find('\n'));
}

lease_watch::verdict lease_watch::observe(const std::string& dir, const std::string& content, double now_s,
                                          double stale_s) {
  auto i = seen_.find(dir);
  if (i == seen_.end() || i->second.content != content) {
    seen_[dir] = seen{content, now_s};
    return verdict{false, 0};
  }
  const double unchanged = now_s - i->second.since_s;
  return verdict{unchanged >= stale_s, unchanged};
}

namespace {

namespace fs = std::filesystem;

std::string generation_name(const std::string& link, uint32_t g) {
  return fs::path(link).filename().string() + "." + std::to_string(g);
}

}  // namespace

std::optional<uint32_t> shard_link_id(const std::string& name) {
  if (name.rfind("shard-", 0) != 0 || name.size() == 6 || name.size() > 15
      || name.find_first_not_of("0123456789", 6) != std::string::npos)
    return std::nullopt;
  return static_cast<uint32_t>(std::strtoul(name.c_str() + 6, nullptr, 10));
}

uint32_t generation_in(const std::string& name, const std::string& base) {
  const auto prefix = base + ".";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() - prefix.size() > 9
      || name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
    return 0;
  return static_cast<uint32_t>(std::strtoul(name.c_str() + prefix.size(), nullptr, 10));
}

namespace {

// The highest generation directory beside `link` (0: none): where a link that a copy of
// the checkpoint directory dropped should point.
uint32_t newest_generation(const std::string& link) {
  const auto base = fs::path(link).filename().string();
  uint32_t newest = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(link).parent_path(), ec)) {
    std::error_code dir_ec;
    if (e.is_directory(dir_ec) && !e.is_symlink(dir_ec))
      newest = std::max(newest, generation_in(e.path().filename().string(), base));
  }
  return newest;
}

// Makes the renames in `dir` durable: a crash after a new generation was synced must not
// bring back the link to the old one.
void sync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return;
  (void)::fsync(fd);
  ::close(fd);
}

// Points `link` at generation `g` (a relative link, so that the checkpoint directory can
// be copied or moved whole), replacing what it pointed to in one rename.
caf::error point_link(const std::string& link, uint32_t g) {
  const std::string tmp = link + ".link-" + std::to_string(g);
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_directory_symlink(generation_name(link, g), tmp, ec);
  if (ec)
    return make_error(errc::io_error, "cannot make the link " + tmp + ": " + ec.message());
  fs::rename(tmp, link, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return make_error(errc::io_error, "cannot move the link " + tmp + " to " + link + ": " + ec.message());
  }
  sync_directory(fs::path(link).parent_path().string());
  return caf::none;
}

}  // namespace

expected<store_generation> store_generation_of(const std::string& link) {
  store_generation out;
  out.link = link;
  std::error_code ec;
  const auto st = fs::symlink_status(link, ec);
  const auto base = fs::path(link).filename().string();
  if (st.type() == fs::file_type::symlink) {
    const auto target = fs::read_symlink(link, ec).string();
    out.generation = ec ? 0 : generation_in(target, base);
    if (out.generation == 0)
      return make_error(errc::io_error, "the checkpoint store link " + link + " points to '" + target
                                          + "', not to a generation " + base + ".N of its own");
    out.path = (fs::path(link).parent_path() / target).string();
    if (fs::symlink_status(out.path, ec).type() == fs::file_type::symlink) // a generation is a directory of its own
      return make_error(errc::io_error, "the checkpoint store generation " + out.path
                                          + " is a symbolic link, not a directory: not used");
    return out;
  }
  if (st.type() == fs::file_type::not_found) {
    // None yet (generation 1), or a copy of the directory that dropped its links: the
    // newest generation.
    out.generation = std::max<uint32_t>(1, newest_generation(link));
    out.path = link + "." + std::to_string(out.generation);
    if (fs::symlink_status(out.path, ec).type() == fs::file_type::symlink)
      return make_error(errc::io_error, "the checkpoint store generation " + out.path
                                          + " is a symbolic link, not a directory: not used");
    if (auto err = point_link(link, out.generation))
      return err;
    return out;
  }
  if (st.type() != fs::file_type::directory)
    return make_error(errc::io_error, "the checkpoint store " + link + " is neither a directory nor a link");
  // A store in a directory of the link's name: the layout before generations, or a copy of
  // the checkpoint directory that followed the links (the directory then holds the newest
  // generation's records). It becomes the newest generation, if no process holds it.
  {
    auto held = open_rocksdb_store(link, open_mode::existing);
    if (!held)
      return held.error();
  }
  out.generation = newest_generation(link) + 1;
  out.path = link + "." + std::to_string(out.generation);
  fs::rename(link, out.path, ec);
  if (ec)
    return make_error(errc::io_error, "cannot move the checkpoint store " + link + " to " + out.path + ": "
                                        + ec.message());
  if (auto err = point_link(link, out.generation))
    return err;
  return out;
}

expected<taken_over_store> take_over_store(const std::string& link, const std::string& shown_link) {
  std::error_code ec;
  if (fs::symlink_status(link, ec).type() != fs::file_type::symlink)
    return make_error(errc::busy, "the checkpoint store " + link + " is of the layout before generations (a "
                                    "directory, not a link to its generation): it cannot be taken over while a "
                                    "process holds it; stop that process");
  auto old = store_generation_of(link);
  if (!old)
    return old.error();
  kv_batch copy;
  {
    auto store = open_rocksdb_store(old->path, open_mode::read_only);
    if (!store)
      return store.error();
    auto keys = (*store)->keys("");
    if (!keys)
      return keys.error();
    for (const auto& k : *keys) {
      auto v = (*store)->get(k);
      if (!v)
        return v.error();
      if (*v)
        copy.puts.emplace_back(k, std::move(**v));
    }
  }
  taken_over_store out;
  out.abandoned = old->path;
  out.now.link = link;
  out.now.generation = std::max(old->generation, newest_generation(link)) + 1;
  out.now.path = link + "." + std::to_string(out.now.generation);
  // Written in a directory of this process's own, then claimed in one rename, which fails
  // where the generation exists already: two nodes taking the store over at once cannot
  // both write into one.
  const std::string mine = link + ".taking-over-" + std::to_string(::getpid()) + "-"
                           + std::to_string(steady_now().time_since_epoch().count());
  {
    auto store = open_rocksdb_store(mine, open_mode::create);
    if (!store)
      return store.error();
    if (auto err = (*store)->write(copy)) {
      store->reset();
      fs::remove_all(mine, ec);
      return err;
    }
  }
  fs::rename(mine, out.now.path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove_all(mine, ignored);
    return make_error(errc::busy, "taking over the checkpoint store " + link + ": its next generation "
                                    + out.now.path + " exists already (another node is taking it over?): "
                                    + ec.message());
  }
  if (auto err = point_link(link, out.now.generation))
    return err; // the link still points to the old generation; the new one is left as it is
  auto store = open_rocksdb_store(out.now.path, open_mode::existing,
                                  (shown_link.empty() ? link : shown_link) + out.now.path.substr(link.size()));
  if (!store)
    return store.error();
  out.store = std::move(*store);
  return out;
}

}  // namespace ashlar
