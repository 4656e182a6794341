#include "runtime/os/remote_start.hpp"

#include <cctype>
#include <cstdlib>

namespace ashlar {

namespace {

constexpr size_t max_file_bytes = 1 << 20; // a TLS file's most

std::string to_hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

bool from_hex(const std::string& hex, std::string& out) {
  if (hex.size() % 2 != 0 || hex.size() > 2 * max_file_bytes)
    return false;
  out.clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = hex_value(hex[i]), lo = hex_value(hex[i + 1]);
    if (hi < 0 || lo < 0)
      return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

bool plain_name(const std::string& n) {
  if (n.empty() || n.size() > 64 || n[0] == '.')
    return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
      return false;
  return true;
}

} // namespace

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out.push_back(c);
  }
  return out + "'";
}

std::string remote_command(const std::vector<std::string>& argv, const std::string& cwd) {
  std::string out;
  if (!cwd.empty())
    out = "cd " + shell_quote(cwd) + " 2>/dev/null; ";
  out += "exec";
  for (const auto& a : argv)
    out += " " + shell_quote(a);
  return out;
}

std::vector<std::string> ssh_argv(const ssh_options& o, const std::string& host, const std::string& command) {
  std::vector<std::string> a = {o.program, "-o", "BatchMode=yes", "-o",
                                "ConnectTimeout=" + std::to_string(static_cast<int>(o.connect_timeout_s + 0.5))};
  if (o.port != 0)
    a.insert(a.end(), {"-p", std::to_string(o.port)});
  if (!o.identity_file.empty())
    a.insert(a.end(), {"-i", o.identity_file});
  if (!o.config_file.empty())
    a.insert(a.end(), {"-F", o.config_file});
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']')
    h = h.substr(1, h.size() - 2);
  a.insert(a.end(), {"--", h, command});
  return a;
}

std::string encode_credentials(const launch_credentials& c) {
  std::string out = "ashlar-credentials 1\n";
  out += "token " + to_hex(c.token) + "\n";
  for (const auto& [name, body] : c.files)
    out += "file " + name + " " + to_hex(body) + "\n";
  return out + "end\n";
}

credentials_reader::status credentials_reader::feed(const std::string& line) {
  auto bad = [this](const std::string& why) {
    error_ = why;
    return status::bad;
  };
  if (!header_) {
    if (line != "ashlar-credentials 1")
      return bad("the launcher's channel does not start with 'ashlar-credentials 1' (got '" + line.substr(0, 40)
                 + "')");
    header_ = true;
    return status::more;
  }
  if (line == "end")
    return status::done;
  if (line.rfind("token ", 0) == 0) {
    if (!from_hex(line.substr(6), c_.token))
      return bad("the launcher's token line is not hex");
    return status::more;
  }
  if (line.rfind("file ", 0) == 0) {
    const auto space = line.find(' ', 5);
    const std::string name = line.substr(5, space == std::string::npos ? std::string::npos : space - 5);
    std::string body;
    if (space == std::string::npos || !plain_name(name) || !from_hex(line.substr(space + 1), body))
      return bad("the launcher's file line for '" + name.substr(0, 64) + "' is not 'file NAME HEX'");
    c_.files.emplace_back(name, body);
    return status::more;
  }
  return bad("the launcher sent '" + line.substr(0, 40) + "' among its credentials");
}

std::string signal_line(int sig) {
  return "signal " + std::to_string(sig) + "\n";
}

int parse_signal_line(const std::string& line) {
  if (line.rfind("signal ", 0) != 0 || line.size() > 10)
    return 0;
  const int sig = std::atoi(line.c_str() + 7);
  return sig > 0 && sig < 65 ? sig : 0;
}

} // namespace ashlar
