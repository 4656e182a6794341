#include "runtime/store/kv_store.hpp"

#include <map>
#include <mutex>

namespace ashlar {

kv_store::~kv_store() = default;

namespace {

class memory_store final : public kv_store {
public:
  caf::error write(const kv_batch& b) override {
    std::lock_guard<std::mutex> lock{mu_};
    for (const auto& [k, v] : b.puts)
      map_[k] = v;
    for (const auto& k : b.deletes)
      map_.erase(k);
    return caf::none;
  }
  expected<std::optional<std::string>> get(const std::string& key) const override {
    std::lock_guard<std::mutex> lock{mu_};
    auto i = map_.find(key);
    if (i == map_.end())
      return std::optional<std::string>{};
    return std::optional<std::string>{i->second};
  }
  expected<std::vector<std::string>> keys(const std::string& prefix) const override {
    std::lock_guard<std::mutex> lock{mu_};
    std::vector<std::string> out;
    for (auto i = map_.lower_bound(prefix); i != map_.end() && i->first.compare(0, prefix.size(), prefix) == 0; ++i)
      out.push_back(i->first);
    return out;
  }
  std::string where() const override { return "memory"; }

private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> map_;
};

}  // namespace

std::unique_ptr<kv_store> make_memory_store() { return std::make_unique<memory_store>(); }

}  // namespace ashlar
