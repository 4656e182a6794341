// `ashlar cert`: the cluster's CA and a certificate per node, for mutual TLS.
#include <cstdio>

#include "apps/ashlar/commands.hpp"
#include "runtime/net/tls.hpp"

namespace ashlar::cli {

namespace {

struct cert_options {
  std::string ca_dir;
  std::string out_dir;
  std::string name;
  int days = 825;
};

int run_cert(const cert_options& o) {
  auto fail = [](const caf::error& err) {
    std::fprintf(stderr, "ashlar cert: %s\n", describe(err).c_str());
    return 1;
  };
  auto made = net::ensure_ca(o.ca_dir);
  if (!made)
    return fail(made.error());
  if (*made)
    std::printf("created the cluster CA in %s (keep ca.key there, private: it admits nodes)\n", o.ca_dir.c_str());
  if (o.out_dir.empty())
    return 0;
  std::string name = o.name.empty() ? o.out_dir.substr(o.out_dir.find_last_of('/') + 1) : o.name;
  if (auto err = net::issue_node_cert(o.ca_dir, o.out_dir, name, o.days))
    return fail(err);
  std::printf("issued a certificate for '%s' in %s (ca.pem, node.pem, node.key); give it to that node with "
              "--tls %s\n",
              name.c_str(), o.out_dir.c_str(), o.out_dir.c_str());
  return 0;
}

} // namespace

command_fn add_cert(CLI::App& app) {
  auto o = std::make_shared<cert_options>();
  auto* cmd = app.add_subcommand("cert", "Make the cluster's CA and node certificates for mutual TLS");
  cmd->footer("Examples:\n"
              "  ashlar cert --ca ca --out tls/scheduler     # creates the CA in ca/ unless it exists\n"
              "  ashlar cert --ca ca --out tls/worker1\n"
              "  ashlar node --role scheduler --listen 0.0.0.0:7400 --tls tls/scheduler\n"
              "Every node and command of the cluster needs a directory of its own (or a copy of one);\n"
              "ca/ca.key stays with whoever admits nodes.");
  cmd->add_option("--ca", o->ca_dir, "directory of the cluster CA (ca.pem, ca.key); created if missing")
    ->required();
  cmd->add_option("--out", o->out_dir, "directory to write ca.pem, node.pem, node.key to");
  cmd->add_option("--name", o->name, "the node's name in its certificate (default: --out's last part)");
  cmd->add_option("--days", o->days, "validity in days")->capture_default_str()->check(CLI::Range(1, 36500));
  return [o] { return run_cert(*o); };
}

}  // namespace ashlar::cli
