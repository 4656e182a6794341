#include <catch2/catch.hpp>

#include <filesystem>
#include <map>

#include "runtime/policy/policy_rules.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/os/memory.hpp"
#include "runtime/os/paths.hpp"
#include "temp_dir.hpp"

using namespace ashlar;

TEST_CASE("a TOML file sets the keys it names and leaves the defaults of the rest") {
  train_config cfg;
  auto err = apply_toml_text(cfg, R"(
[train]
workers = 3
policy = "asp"
lr = 0.2
[model]
hidden = [32, 16, 8]
)", "t.toml");
  REQUIRE_FALSE(err);
  CHECK(cfg.workers == 3);
  CHECK(cfg.policy == "asp");
  CHECK(cfg.optimizer.lr == Approx(0.2f));
  CHECK(cfg.model.hidden == std::vector<uint32_t>{32, 16, 8});
  CHECK(cfg.servers == 2);
  CHECK(cfg.epochs == 10);
  CHECK_FALSE(validate_job(cfg));
}

TEST_CASE("the environment overrides the file and explicit settings override both") {
  train_config cfg;
  REQUIRE_FALSE(apply_toml_text(cfg, "[train]\nworkers = 3\nepochs = 2\n", "t.toml"));
  std::map<std::string, std::string> env{{"ASHLAR_TRAIN_WORKERS", "5"}, {"ASHLAR_DATA_DIR", "/d"}};
  REQUIRE_FALSE(apply_environment(cfg, [&](const char* n) -> const char* {
    auto i = env.find(n);
    return i == env.end() ? nullptr : i->second.c_str();
  }));
  CHECK(cfg.workers == 5);
  CHECK(cfg.epochs == 2);
  CHECK(cfg.data_dir == "/d");
  REQUIRE_FALSE(apply_setting(cfg, "train.workers", "7"));
  CHECK(cfg.workers == 7);
}

TEST_CASE("an unknown config key is refused, naming the key, file and line") {
  train_config cfg;
  auto err = apply_toml_text(cfg, "[train]\nworkers = 2\nwrokers = 3\n", "job.toml");
  REQUIRE(err);
  auto msg = describe(err);
  CHECK(msg.find("job.toml:3") != std::string::npos);
  CHECK(msg.find("unknown config key 'train.wrokers' (did you mean 'train.workers'?)") != std::string::npos);
  CHECK(msg.find("train.batch_size") == std::string::npos); // no dump of every key
  CHECK(is(apply_setting(cfg, "nope.x", "1"), errc::invalid_config));
}

TEST_CASE("a value of the wrong type is refused, naming the key") {
  train_config cfg;
  auto err = apply_toml_text(cfg, "[train]\nworkers = \"many\"\n", "job.toml");
  REQUIRE(err);
  CHECK(describe(err).find("train.workers: 'many' is not a non-negative integer") != std::string::npos);
  CHECK(apply_setting(cfg, "train.workers", "-1"));
  CHECK(apply_setting(cfg, "train.lr", "fast"));
  CHECK(apply_setting(cfg, "run.eval_every_epoch", "maybe"));
}

TEST_CASE("a TOML syntax error names the file, line and column") {
  train_config cfg;
  auto err = apply_toml_text(cfg, "[train\nworkers = 2\n", "bad.toml");
  REQUIRE(err);
  CHECK(describe(err).find("bad.toml:1:") != std::string::npos);
}

TEST_CASE("a missing config file gives io_error naming it") {
  train_config cfg;
  auto err = apply_toml_file(cfg, "/nonexistent/ashlar.toml");
  CHECK(is(err, errc::io_error));
  CHECK(describe(err).find("/nonexistent/ashlar.toml") != std::string::npos);
}

TEST_CASE("validation names the inconsistent key") {
  train_config cfg;
  cfg.workers = 0;
  CHECK(describe(validate_job(cfg)).find("train.workers") != std::string::npos);
  cfg = train_config{};
  cfg.policy = "magic";
  CHECK(describe(validate_job(cfg)).find("train.policy 'magic' is not known (known: bsp, asp") != std::string::npos);
  cfg.policy = "bps"; // a near miss gets the suggestion, as a mistyped option does
  CHECK(describe(validate_job(cfg)).find("train.policy 'bps' is not known (did you mean 'bsp'?)") != std::string::npos);
  cfg = train_config{};
  cfg.model.hidden = {};
  cfg.model.input = tensor_shape{1, 1, 1};
  cfg.model.classes = 2;
  cfg.servers = 5;
  CHECK(describe(validate_job(cfg)).find("exceeds the 4 parameters") != std::string::npos);
  // Compression that would not compress, and commit scales outside (0, 1].
  cfg = train_config{};
  cfg.topk_ratio = 0.5;
  CHECK(describe(validate_job(cfg)).find("train.topk_ratio must be in [0, 0.5)") != std::string::npos);
  cfg = train_config{};
  cfg.ashl.topk_ratio = -0.1;
  CHECK(describe(validate_job(cfg)).find("ashl.topk_ratio") != std::string::npos);
  cfg = train_config{};
  cfg.commit_scale = 2;
  CHECK(describe(validate_job(cfg)).find("train.commit_scale") != std::string::npos);
  cfg = train_config{};
  cfg.local_momentum = 1;
  CHECK(describe(validate_job(cfg)).find("train.local_momentum must be in [0, 1)") != std::string::npos);
  // The data plane's bound on a connection's unanswered requests holds a worker's chunks.
  cfg = train_config{};
  cfg.chunks_in_flight = 17;
  CHECK(describe(validate_job(cfg)).find("train.chunks_in_flight must be in [1, 16]") != std::string::npos);
  cfg.chunks_in_flight = 16;
  CHECK_FALSE(validate_job(cfg));
  // A target accuracy is a fraction, and needs evaluations to be seen.
  cfg = train_config{};
  cfg.target_accuracy = 85;
  CHECK(describe(validate_job(cfg)).find("run.target_accuracy must be in [0, 1]") != std::string::npos);
  cfg = train_config{};
  cfg.target_accuracy = 0.85;
  cfg.eval_every_epoch = false;
  CHECK(describe(validate_job(cfg)).find("run.target_accuracy needs test evaluations") != std::string::npos);
  cfg.eval_interval = 0.5;
  CHECK_FALSE(validate_job(cfg));
  // The floor of workers a job goes on with lies between 1 and its workers.
  cfg = train_config{};
  cfg.min_workers = 5;
  CHECK(describe(validate_job(cfg)).find("train.min_workers = 5 must be between 1 and train.workers = 4")
        != std::string::npos);
  cfg.min_workers = 0;
  CHECK(describe(validate_job(cfg)).find("train.min_workers = 0") != std::string::npos);
  cfg.min_workers = 4;
  CHECK_FALSE(validate_job(cfg));
}

TEST_CASE("every config key documents its default") {
  for (const auto& k : config_keys()) {
    CHECK(k.help.find("default") != std::string::npos);
    CHECK(k.env.rfind("ASHLAR_", 0) == 0);
  }
}

TEST_CASE("modes are enums: an unknown one is refused where it is read, naming the place, the key and the choices") {
  train_config cfg;
  auto err = apply_toml_text(cfg, "[train]\nallocation = \"greedy\"\n", "job.toml");
  REQUIRE(err);
  CHECK(describe(err).find("job.toml:2") != std::string::npos);
  CHECK(describe(err).find("train.allocation 'greedy' is not known (known: equal, proportional, adaptive, "
                           "predicted)") != std::string::npos);
  CHECK(cfg.allocation == allocation_mode::equal);
  REQUIRE_FALSE(apply_toml_text(cfg, "[train]\nallocation = \"predicted\"\nlr_schedule = \"step\"\n"
                                     "[data]\nsource = \"synthetic\"\n[ashl]\nrule = \"loss\"\n", "job.toml"));
  CHECK(cfg.allocation == allocation_mode::predicted);
  CHECK(cfg.lr_schedule == lr_schedule::step);
  CHECK(cfg.data_source == data_source_kind::synthetic);
  CHECK(cfg.ashl.rule == ashl_rule::loss);
  // Their text form is the name, as in the file.
  CHECK(setting_text(cfg, "train.allocation") == "predicted");
  CHECK(setting_text(cfg, "data.source") == "synthetic");
  CHECK(setting_text(cfg, "ashl.rule") == "loss");
  auto env = apply_environment(cfg, [](const char* name) -> const char* {
    return std::string{name} == "ASHLAR_DATA_SOURCE" ? "mnist" : nullptr;
  });
  REQUIRE(env);
  CHECK(describe(env).find("data.source must be fashion-mnist, npy or synthetic, not 'mnist'") != std::string::npos);
  // A section is a type of its own: a module can take only the settings it reads.
  const data_settings& data = cfg;
  CHECK(data.data_source == data_source_kind::synthetic);
}

TEST_CASE("numbers that overflow or would silently change a setting's meaning are refused, naming the key") {
  train_config cfg;
  auto lr = apply_setting(cfg, "train.lr", "1e39");
  REQUIRE(lr);
  CHECK(describe(lr).find("train.lr") != std::string::npos);
  CHECK(describe(lr).find("3.4e38") != std::string::npos);
  REQUIRE_FALSE(apply_setting(cfg, "train.sample_ms", "1e300"));
  auto pace = validate_job(cfg);
  REQUIRE(pace);
  CHECK(describe(pace).find("train.sample_ms") != std::string::npos);
  cfg = train_config{};
  REQUIRE_FALSE(apply_setting(cfg, "model.hidden", "50000,50000"));
  auto big = validate_job(cfg);
  REQUIRE(big);
  CHECK(describe(big).find("parameters; Ashlar takes at most 2147483647") != std::string::npos);
}

TEST_CASE("a model that would not fit in memory is refused before it is allocated, with the estimate") {
  CHECK_FALSE(check_model_memory(1000, 10, 1u << 20, "m")); // 40 KB of 1 MiB
  CHECK_FALSE(check_model_memory(uint64_t{1} << 40, 10, 0, "m")); // unknown memory: not checked
  auto err = check_model_memory(uint64_t{1} << 28, 18, uint64_t{8} << 30, "784-20000-20000-10");
  REQUIRE(err);
  CHECK(describe(err).find("model 784-20000-20000-10 does not fit") != std::string::npos);
  CHECK(describe(err).find("about 18.0 GiB") != std::string::npos);
  CHECK(describe(err).find("8.0 GiB is available") != std::string::npos);
  CHECK(available_memory_bytes() > 0); // /proc/meminfo on Linux
}

TEST_CASE("the memory a process may take is bounded by its cgroup and every ancestor's limit, v1 or v2") {
  using ashlar::test::temp_dir;
  namespace fs = std::filesystem;
  auto put = [](const temp_dir& t, const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path{t.file(rel)}.parent_path());
    t.write(rel, text);
  };
  temp_dir v1;
  put(v1, "proc/self/cgroup", "9:cpu:/\n4:memory:/jobs/a\n0::/\n");
  put(v1, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"); // unlimited
  put(v1, "sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "800000000\n");
  put(v1, "sys/fs/cgroup/memory/jobs/memory.usage_in_bytes", "700000000\n");
  put(v1, "sys/fs/cgroup/memory/jobs/a/memory.limit_in_bytes", "1000000000\n");
  put(v1, "sys/fs/cgroup/memory/jobs/a/memory.usage_in_bytes", "300000000\n");
  CHECK(cgroup_memory_room(v1.path()) == std::optional<uint64_t>{100000000}); // the parent's room
  temp_dir v2;
  put(v2, "proc/self/cgroup", "0::/user.slice/run\n");
  put(v2, "sys/fs/cgroup/cgroup.controllers", "memory\n");
  put(v2, "sys/fs/cgroup/user.slice/memory.max", "2000000\n");
  put(v2, "sys/fs/cgroup/user.slice/memory.current", "500000\n");
  put(v2, "sys/fs/cgroup/user.slice/run/memory.max", "max\n");
  put(v2, "sys/fs/cgroup/user.slice/run/memory.current", "400000\n");
  CHECK(cgroup_memory_room(v2.path()) == std::optional<uint64_t>{1500000});
  temp_dir container; // a cgroup namespace: the hierarchy's root is the container's own
  put(container, "proc/self/cgroup", "0::/kubepods/pod1/c\n");
  put(container, "sys/fs/cgroup/memory.max", "1073741824\n");
  put(container, "sys/fs/cgroup/memory.current", "73741824\n");
  CHECK(cgroup_memory_room(container.path()) == std::optional<uint64_t>{1000000000});
  temp_dir none;
  put(none, "proc/self/cgroup", "0::/\n");
  put(none, "sys/fs/cgroup/memory.max", "max\n");
  CHECK_FALSE(cgroup_memory_room(none.path()));
  temp_dir over; // usage past its limit: no room, not a wrapped number
  put(over, "proc/self/cgroup", "4:memory:/\n");
  put(over, "sys/fs/cgroup/memory/memory.limit_in_bytes", "1000\n");
  put(over, "sys/fs/cgroup/memory/memory.usage_in_bytes", "5000\n");
  CHECK(cgroup_memory_room(over.path()) == std::optional<uint64_t>{0});
  CHECK_FALSE(cgroup_memory_room("/nonexistent-root"));
}

TEST_CASE("an output file is checked before any work: its directory must exist and be writable") {
  CHECK_FALSE(check_output_file("/tmp/ashlar-report.json", "run.report"));
  CHECK_FALSE(check_output_file("report.json", "run.report")); // the working directory
  auto missing = check_output_file("/nonexistent-dir/r.json", "run.report");
  REQUIRE(missing);
  CHECK(describe(missing).find("run.report: cannot write /nonexistent-dir/r.json: the directory /nonexistent-dir "
                               "does not exist") != std::string::npos);
  auto dir = check_output_file("/tmp", "run.report");
  REQUIRE(dir);
  CHECK(describe(dir).find("it is a directory") != std::string::npos);
}

TEST_CASE("an environment variable that looks like Ashlar's but is none is named with the one it may mean") {
  auto w = environment_warnings({"PATH", "ASHLAR_TRAIN_EPOCH", "ASHLAR_TRAIN_EPOCHS", "ASHLAR_TOKEN", "ASHLAR_TEST_BINARY",
                                 "ASHLAR_ZZZ"});
  REQUIRE(w.size() == 2);
  CHECK(w[0] == "environment variable ASHLAR_TRAIN_EPOCH is not one Ashlar reads (did you mean "
                "'ASHLAR_TRAIN_EPOCHS'?); it is ignored");
  CHECK(w[1] == "environment variable ASHLAR_ZZZ is not one Ashlar reads; it is ignored");
}
