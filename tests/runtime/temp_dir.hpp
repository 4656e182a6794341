// A temporary directory for a test, removed with everything in it at scope exit.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ashlar::test {

class temp_dir {
public:
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ashlar-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    auto p = file(name);
    std::ofstream out{p, std::ios::binary};
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  std::string write(const std::string& name, const std::string& text) const {
    return write(name, std::vector<uint8_t>(text.begin(), text.end()));
  }

private:
  std::string path_;
};

}  // namespace ashlar::test
