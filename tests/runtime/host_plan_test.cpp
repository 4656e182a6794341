// `ashlar launch --hosts` (runtime/control/host_plan.hpp): host lists and hostfiles as
// horovodrun and DeepSpeed write them, the placement of nodes on hosts, and the launcher's
// channel to a node under ssh (runtime/os/remote_start.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>

#include "runtime/control/host_plan.hpp"
#include "runtime/os/remote_start.hpp"

using namespace ashlar;
using namespace ashlar::control;

namespace {

std::vector<host_slots> list(const std::string& text) {
  auto h = parse_host_list(text);
  REQUIRE(h);
  return *h;
}

std::string error_of(const expected<std::vector<host_slots>>& r) {
  REQUIRE(!r);
  return describe(r.error());
}

} // namespace

TEST_CASE("a host list gives each host its slots, one where no count is written, IPv6 in brackets") {
  auto h = list("gpu1:4, gpu2:2,cpu-a,[::1]:3,10.0.0.5:1");
  REQUIRE(h.size() == 5);
  CHECK(h[0].host == "gpu1");
  CHECK(h[0].slots == 4);
  CHECK(h[1].host == "gpu2");
  CHECK(h[1].slots == 2);
  CHECK(h[2].host == "cpu-a");
  CHECK(h[2].slots == 1);
  CHECK(h[3].host == "[::1]");
  CHECK(h[3].slots == 3);
  CHECK(h[4].host == "10.0.0.5");
  CHECK(h[4].where == "--hosts entry 5");
}

TEST_CASE("a malformed host list is refused naming the entry") {
  CHECK_THAT(error_of(parse_host_list("a:4,b:0")), Catch::Contains("--hosts entry 2") && Catch::Contains("'0'"));
  CHECK_THAT(error_of(parse_host_list("a:x")), Catch::Contains("entry 1"));
  CHECK_THAT(error_of(parse_host_list("a:")), Catch::Contains("entry 1"));
  CHECK_THAT(error_of(parse_host_list("a:99999")), Catch::Contains("from 1 to 4096"));
  CHECK_THAT(error_of(parse_host_list("a,b;rm -rf")), Catch::Contains("does not name a host"));
  CHECK_THAT(error_of(parse_host_list("[::1:2")), Catch::Contains("without closing"));
  CHECK_THAT(error_of(parse_host_list("")), Catch::Contains("names no host"));
  CHECK_THAT(error_of(parse_host_list("a:2,b,a:1")),
             Catch::Contains("entry 3") && Catch::Contains("named again") && Catch::Contains("entry 1"));
}

TEST_CASE("a hostfile reads as Horovod, DeepSpeed and Open MPI write it, comments and blank lines skipped") {
  auto h = parse_hostfile("# the cluster\ngpu1 slots=4\n\n  gpu2   slots=2 max_slots=8  # old ones\ncpu-a\ncpu-b:3\n",
                          "hosts.txt");
  REQUIRE(h);
  REQUIRE(h->size() == 4);
  CHECK((*h)[0].slots == 4);
  CHECK((*h)[1].host == "gpu2");
  CHECK((*h)[1].slots == 2);
  CHECK((*h)[1].where == "hosts.txt:4");
  CHECK((*h)[2].slots == 1);
  CHECK((*h)[3].slots == 3);
  CHECK_THAT(error_of(parse_hostfile("a slots=2\nb cores=4\n", "hf")), Catch::Contains("hf:2") && Catch::Contains("cores=4"));
  CHECK_THAT(error_of(parse_hostfile("a slots=two\n", "hf")), Catch::Contains("hf:1"));
  CHECK_THAT(error_of(parse_hostfile("# nothing\n\n", "hf")), Catch::Contains("hf names no host"));
}

TEST_CASE("the nodes are placed as horovodrun places ranks: every slot a worker, servers round the hosts") {
  auto plan = plan_hosts(list("h1:4,h2:2,h3:1"), 0, 2);
  REQUIRE(plan);
  CHECK(plan->workers == 7);
  CHECK(plan->servers == 2);
  CHECK_FALSE(plan->loopback_only);
  REQUIRE(plan->nodes.size() == 5);
  CHECK(plan->nodes[0].kind == host_node::server);
  CHECK(plan->nodes[0].host == "h1");
  CHECK(plan->nodes[1].host == "h2");
  CHECK(plan->nodes[1].name == "server-1@h2");
  CHECK(plan->nodes[2].kind == host_node::worker);
  CHECK(plan->nodes[2].slots == 4);
  CHECK(plan->nodes[2].name == "worker@h1");
  CHECK(plan->nodes[4].slots == 1);
  CHECK(plan->describe() == "h1: server-0, 4 workers; h2: server-1, 2 workers; h3: 1 worker");
}

TEST_CASE("asking for fewer workers than slots fills the hosts in order, more is refused naming the slots") {
  auto plan = plan_hosts(list("h1:4,h2:2,h3:1"), 5, 1);
  REQUIRE(plan);
  CHECK(plan->workers == 5);
  REQUIRE(plan->nodes.size() == 3); // server-0, h1's 4, h2's 1; h3 runs nothing
  CHECK(plan->nodes[1].slots == 4);
  CHECK(plan->nodes[2].host == "h2");
  CHECK(plan->nodes[2].slots == 1);
  auto more = plan_hosts(list("h1:4,h2:2"), 9, 1);
  REQUIRE(!more);
  CHECK_THAT(describe(more.error()), Catch::Contains("9 workers") && Catch::Contains("6 slots"));
  auto none = plan_hosts(list("h1:4"), 0, 0);
  REQUIRE(!none);
  CHECK_THAT(describe(none.error()), Catch::Contains("train.servers"));
}

TEST_CASE("a job whose every host is this machine's loopback stays on loopback, one other host takes it off") {
  CHECK(plan_hosts(list("127.0.0.1:2,localhost:1,[::1]:1"), 0, 1)->loopback_only);
  CHECK_FALSE(plan_hosts(list("127.0.0.1:2,10.1.2.3:1"), 0, 1)->loopback_only);
  CHECK(is_loopback_host("127.0.1.1"));
  CHECK_FALSE(is_loopback_host("gpu1"));
}

TEST_CASE("a remote command quotes every word, so no argument is read by the remote shell") {
  CHECK(shell_quote("plain") == "'plain'");
  CHECK(shell_quote("it's $(rm -rf /)") == "'it'\\''s $(rm -rf /)'");
  CHECK(remote_command({"/opt/ashlar", "node", "--name", "w 1"}, "/home/u/run dir") ==
        "cd '/home/u/run dir' 2>/dev/null; exec '/opt/ashlar' 'node' '--name' 'w 1'");
  ssh_options o;
  o.port = 2222;
  o.identity_file = "/k";
  auto a = ssh_argv(o, "[::1]", "true");
  CHECK(a.front() == "ssh");
  CHECK(std::find(a.begin(), a.end(), "BatchMode=yes") != a.end());
  CHECK(std::find(a.begin(), a.end(), "2222") != a.end());
  CHECK(a[a.size() - 2] == "::1");
  CHECK(a[a.size() - 3] == "--"); // a host can never be read as an option of ssh
  CHECK(a.back() == "true");
}

TEST_CASE("the launcher's channel carries the token and TLS files whole, then signals") {
  launch_credentials c;
  c.token = "0123abcd";
  c.files = {{"ca.pem", "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"}, {"node.key", std::string("\0\x01\xff", 3)}};
  const std::string text = encode_credentials(c);
  credentials_reader r;
  size_t start = 0, lines = 0;
  auto st = credentials_reader::status::more;
  while (st == credentials_reader::status::more) {
    const auto nl = text.find('\n', start);
    REQUIRE(nl != std::string::npos);
    st = r.feed(text.substr(start, nl - start));
    start = nl + 1;
    ++lines;
  }
  CHECK(st == credentials_reader::status::done);
  CHECK(lines == 5);
  CHECK(start == text.size());
  CHECK(r.credentials().token == c.token);
  CHECK(r.credentials().files == c.files);
  CHECK(parse_signal_line("signal 15") == SIGTERM);
  CHECK(parse_signal_line(signal_line(SIGKILL).substr(0, 8)) == SIGKILL);
  CHECK(parse_signal_line("signal x") == 0);
  CHECK(parse_signal_line("hello") == 0);
}

TEST_CASE("a channel that is not the launcher's, or a file name that would leave the directory, is refused") {
  credentials_reader a;
  CHECK(a.feed("GET / HTTP/1.1") == credentials_reader::status::bad);
  CHECK_THAT(a.error(), Catch::Contains("ashlar-credentials 1"));
  credentials_reader b;
  REQUIRE(b.feed("ashlar-credentials 1") == credentials_reader::status::more);
  CHECK(b.feed("file ../../etc/passwd 41") == credentials_reader::status::bad);
  credentials_reader c;
  REQUIRE(c.feed("ashlar-credentials 1") == credentials_reader::status::more);
  CHECK(c.feed("token zz") == credentials_reader::status::bad);
  credentials_reader d;
  REQUIRE(d.feed("ashlar-credentials 1") == credentials_reader::status::more);
  CHECK(d.feed("run rm -rf /") == credentials_reader::status::bad);
}
