#include "runtime/store/store_lease.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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
  lease->renewer_ = std::thread{[l = lease.get()] {
    std::unique_lock<std::mutex> lock{l->mu_};
    while (!l->cv_.wait_for(lock, std::chrono::milliseconds(l->renew_ms_), [l] { return l->stop_; }))
      l->write_lease();
  }};
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
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0)
    std::strcpy(host, "an unknown host");
  return "pid " + std::to_string(::getpid()) + " on " + host;
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
  return caf::none;
}

}  // namespace

expected<store_generation> store_generation_of(const std::string& link) {
  store_generation out;
  out.link = link;
  std::error_code ec;
  const auto st = fs::symlink_status(link, ec);
  if (st.type() == fs::file_type::symlink) {
    const auto target = fs::read_symlink(link, ec).string();
    const auto prefix = fs::path(link).filename().string() + ".";
    if (ec || target.rfind(prefix, 0) != 0 || target.size() == prefix.size()
        || target.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
      return make_error(errc::io_error, "the checkpoint store link " + link + " points to '" + target
                                          + "', not to a generation " + prefix + "N of its own");
    out.generation = static_cast<uint32_t>(std::stoul(target.substr(prefix.size())));
    out.path = (fs::path(link).parent_path() / target).string();
    return out;
  }
  out.generation = 1;
  out.path = link + ".1";
  if (st.type() == fs::file_type::not_found) {
    if (auto err = point_link(link, 1))
      return err;
    return out;
  }
  if (st.type() != fs::file_type::directory)
    return make_error(errc::io_error, "the checkpoint store " + link + " is neither a directory nor a link");
  // The layout before generations: moved behind a link, if no process holds it.
  {
    auto held = open_rocksdb_store(link, open_mode::existing);
    if (!held)
      return held.error();
  }
  if (fs::exists(out.path, ec))
    return make_error(errc::io_error, "cannot move the checkpoint store " + link + " to " + out.path
                                        + ": that exists already");
  fs::rename(link, out.path, ec);
  if (ec)
    return make_error(errc::io_error, "cannot move the checkpoint store " + link + " to " + out.path + ": "
                                        + ec.message());
  if (auto err = point_link(link, 1))
    return err;
  return out;
}

expected<taken_over_store> take_over_store(const std::string& link) {
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
  out.now.generation = old->generation + 1;
  out.now.path = link + "." + std::to_string(out.now.generation);
  fs::remove_all(out.now.path, ec); // a takeover that stopped halfway
  auto store = open_rocksdb_store(out.now.path, open_mode::create);
  if (!store)
    return store.error();
  if (auto err = (*store)->write(copy)) {
    store->reset();
    fs::remove_all(out.now.path, ec);
    return err;
  }
  if (auto err = point_link(link, out.now.generation)) {
    store->reset();
    fs::remove_all(out.now.path, ec);
    return err;
  }
  out.store = std::move(*store);
  return out;
}

}  // namespace ashlar
