// `ashlar checkpoint list|show|export|verify DIR`: what a job's checkpoint directory holds
// (the shards' RocksDB stores in DIR/shard-ID and the job's in DIR/job), and whether a
// resume can start from it. Stores are opened read-only, so this works while the job runs.
// `ashlar checkpoint clean DIR` removes what takeovers of a store left behind.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "apps/ashlar/commands.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/core/clock.hpp"
#include "runtime/core/error.hpp"
#include "runtime/data/npy.hpp"
#include "runtime/metrics/json.hpp"
#include "runtime/store/checkpoint.hpp"
#include "runtime/store/job_store.hpp"
#include "runtime/store/store_clean.hpp"
#include "runtime/store/store_lease.hpp"

namespace ashlar::cli {

namespace {

struct checkpoint_options {
  std::string dir;
  double watch = lease_stale_s; // clean: seconds to watch for a process still writing
  bool dry_run = false;         // clean: say what would go, remove nothing
  int64_t shard = -1;     // show: which shard (-1: all)
  int64_t cut = -1;       // show/export: which cut (-1: the one a resume takes)
  std::string out;        // export: the .npy or .npz file
  bool params = false;    // export: the parameters even where the running average is stored
};

// What an export writes of each shard: the running average where every shard's record
// holds one (what the job's evaluations and final accuracy read) unless --params asks for
// the parameters; the parameters otherwise. Says which on stdout.
bool export_average(const checkpoint_options& o, const std::vector<shard_checkpoint>& cs) {
  size_t with = 0;
  std::string without;
  for (const auto& c : cs) {
    with += c.average.empty() ? 0 : 1;
    if (c.average.empty())
      without += (without.empty() ? "" : ", ") + std::to_string(c.shard_id);
  }
  if (with == 0)
    return false;
  if (o.params) {
    std::printf("exporting the parameters (--params), not the running average the job evaluated\n");
    return false;
  }
  if (with < cs.size()) {
    std::printf("exporting the parameters: %zu of %zu shards' records hold a running average (not shard %s)\n",
                with, cs.size(), without.c_str());
    return false;
  }
  std::printf("exporting the running average of the parameters (train.average_epochs), which the job's "
              "evaluations read; --params for the parameters themselves\n");
  return true;
}

const std::vector<float>& exported(const shard_checkpoint& c, bool average) {
  return average ? c.average : c.params;
}

std::string local_time(int64_t unix_ns) {
  if (unix_ns <= 0)
    return "-";
  std::time_t t = static_cast<std::time_t>(unix_ns / 1000000000);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

// The shard stores of a checkpoint directory, by shard id.
expected<std::map<uint32_t, std::unique_ptr<kv_store>>> open_shards(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return make_error(errc::io_error, dir + " is not a directory (a job's --checkpoint-dir)");
  std::map<uint32_t, std::unique_ptr<kv_store>> out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto id = shard_link_id(e.path().filename().string());
    if (!id)
      continue;
    std::error_code dir_ec;
    if (!std::filesystem::is_directory(e.path(), dir_ec))
      continue; // a link to a generation whose store was never created: nothing stored
    auto store = open_rocksdb_store(e.path().string(), open_mode::read_only);
    if (!store)
      return store.error();
    out[*id] = std::move(*store);
  }
  if (out.empty())
    return make_error(errc::io_error, dir + " holds no shard checkpoints (no shard-ID directories)");
  return out;
}

// What a resume would find in a directory: the job's committed cuts and each shard's
// intact ones, and the cut it takes (or why it refuses).
struct resume_view {
  std::optional<job_record> job;   // the newest committed record
  std::vector<uint64_t> committed; // newest first
  std::vector<shard_cuts> shards;
  expected<cut_choice> choice{cut_choice{}};
};

expected<resume_view> view_of(const std::string& dir, const std::map<uint32_t, std::unique_ptr<kv_store>>& shards) {
  resume_view v;
  std::error_code ec;
  if (std::filesystem::exists(dir + "/job", ec)) {
    auto job = open_rocksdb_store(dir + "/job", open_mode::read_only);
    if (!job)
      return job.error();
    auto cuts = load_job_cuts(**job);
    if (!cuts)
      return cuts.error();
    for (const auto& c : *cuts)
      v.committed.push_back(c.cut);
    if (!cuts->empty())
      v.job = cuts->front();
  }
  for (const auto& [id, store] : shards) {
    auto cuts = checkpoint_log{*store, id, 1}.intact_cuts();
    if (!cuts)
      return cuts.error();
    v.shards.push_back({id, std::move(*cuts)});
  }
  v.choice = choose_cut(v.committed, v.shards, dir);
  return v;
}

// The chosen cut of each shard: `cut`, or the one a resume takes.
expected<std::vector<shard_checkpoint>> chosen(const std::string& dir,
                                               const std::map<uint32_t, std::unique_ptr<kv_store>>& shards,
                                               int64_t cut, int64_t only) {
  if (cut < 0) {
    auto v = view_of(dir, shards);
    if (!v)
      return v.error();
    if (!v->choice)
      return v->choice.error();
    if (v->choice->cut == 0)
      return make_error(errc::io_error, dir + " holds no checkpoint cut");
    cut = static_cast<int64_t>(v->choice->cut);
  }
  std::vector<shard_checkpoint> out;
  for (const auto& [id, store] : shards) {
    if (only >= 0 && id != only)
      continue;
    auto c = checkpoint_log{*store, id, 1}.load(static_cast<uint64_t>(cut));
    if (!c)
      return c.error();
    out.push_back(std::move(*c));
  }
  if (out.empty())
    return make_error(errc::invalid_argument, "no shard " + std::to_string(only) + " in the directory");
  return out;
}

std::string cuts_text(const std::vector<uint64_t>& cuts) {
  std::string out;
  for (auto c : cuts)
    if (c != 0) // 0: the job's start record, not a cut
      out += (out.empty() ? "" : ", ") + std::to_string(c);
  return out.empty() ? "none" : out;
}

void print_job(const job_record& r, const std::vector<uint64_t>& committed) {
  std::printf("job: %" PRIu64 " samples trained in %.1f s, resumed %u times, saved %s%s%s; committed cuts %s\n",
              r.samples, r.seconds, r.resumes, local_time(r.unix_ns).c_str(), r.stage.empty() ? "" : ", stage ",
              r.stage.c_str(), cuts_text(committed).c_str());
  for (const auto& w : r.workers)
    std::printf("  worker %u: batch %u, samples [%" PRIu64 ", %" PRIu64 ") at pass %" PRIu64 " + %" PRIu64
                ", %" PRIu64 " samples trained\n",
                w.id, w.batch, w.position.begin, w.position.begin + w.position.count, w.position.epoch,
                w.position.pos, w.samples);
}

int list(const checkpoint_options& o) {
  auto shards = open_shards(o.dir);
  auto view = shards ? view_of(o.dir, *shards) : expected<resume_view>{shards.error()};
  if (!view) {
    std::fprintf(stderr, "ashlar checkpoint list: %s\n", describe(view.error()).c_str());
    return 1;
  }
  if (view->job)
    print_job(*view->job, view->committed);
  std::printf("%-6s %-6s %-10s %-20s %-12s %s\n", "shard", "cut", "version", "time", "bytes", "checksum");
  int bad = 0;
  for (const auto& [id, store] : *shards) {
    auto items = checkpoint_log{*store, id, 1}.list();
    if (!items) {
      std::fprintf(stderr, "ashlar checkpoint list: shard %u: %s\n", id, describe(items.error()).c_str());
      return 1;
    }
    for (const auto& i : *items) {
      std::printf("%-6u %-6s %-10" PRIu64 " %-20s %-12" PRIu64 " %s\n", id,
                  i.cut != 0 ? std::to_string(i.cut).c_str() : "stop", i.version, local_time(i.unix_ns).c_str(),
                  i.bytes, i.intact ? "ok" : ("BAD: " + i.problem).c_str());
      bad += i.intact ? 0 : 1;
    }
  }
  if (bad > 0)
    std::printf("%d record(s) fail their check\n", bad);
  if (!view->choice)
    std::printf("a resume is refused: %s\n", describe(view->choice.error()).c_str());
  else if (view->choice->cut != 0)
    std::printf("a resume takes cut %" PRIu64 "%s%s\n", view->choice->cut,
                view->choice->passed_over.empty() ? "" : ", passing over ", view->choice->passed_over.c_str());
  else if (view->job)
    std::printf("a resume starts the job from the beginning: no cut is committed yet\n");
  return 0;
}

// Checks a directory end to end: every store opens (RocksDB finds no damage in its log),
// every record decodes and matches its checksum, the job record names a cut every shard
// holds, and that cut's ranges tile the job's model. Exit 0 when all is intact, 1 when
// anything is not (saying whether a resume still works, and from which cut).
int verify(const checkpoint_options& o) {
  auto fail = [](const std::string& why) {
    std::printf("FAILED: %s\n", why.c_str());
    return 1;
  };
  auto shards = open_shards(o.dir);
  if (!shards)
    return fail(describe(shards.error()));
  auto view = view_of(o.dir, *shards);
  if (!view)
    return fail(describe(view.error()));
  int problems = 0;
  if (!view->job) {
    std::printf("job record: MISSING in %s/job\n", o.dir.c_str());
    ++problems;
  } else {
    std::printf("job record: committed cuts %s, %" PRIu64 " samples trained as of cut %" PRIu64 "\n",
                cuts_text(view->committed).c_str(), view->job->samples, view->job->cut);
  }
  uint64_t bytes = 0;
  for (const auto& [id, store] : *shards) {
    auto items = checkpoint_log{*store, id, 1}.list();
    if (!items)
      return fail("shard " + std::to_string(id) + ": " + describe(items.error()));
    std::string bad;
    for (const auto& i : *items) {
      bytes += i.bytes;
      if (!i.intact) {
        bad += (bad.empty() ? "" : "; ") + (i.cut != 0 ? "cut " + std::to_string(i.cut) : std::string{"stop record"})
               + ": " + i.problem;
        ++problems;
      }
    }
    std::vector<uint64_t> intact;
    for (const auto& s : view->shards)
      if (s.shard_id == id)
        intact = s.intact;
    std::printf("shard %u: intact cuts %s%s%s\n", id, cuts_text(intact).c_str(), bad.empty() ? "" : "; BAD ",
                bad.c_str());
  }
  if (!view->choice)
    return fail(describe(view->choice.error()));
  if (view->choice->cut == 0 && view->job && problems == 0) {
    std::printf("ok: the job's start record, no cut committed yet: a resume starts the job from the beginning\n");
    return 0;
  }
  if (view->choice->cut == 0)
    return fail("no checkpoint cut: nothing to resume from");
  // The chosen cut's ranges must tile the model, shard after shard.
  auto cs = chosen(o.dir, *shards, static_cast<int64_t>(view->choice->cut), -1);
  if (!cs)
    return fail(describe(cs.error()));
  uint64_t expect = 0;
  for (const auto& c : *cs) {
    if (c.begin != expect)
      return fail("cut " + std::to_string(c.cut) + ": shard " + std::to_string(c.shard_id) + " holds ["
                  + std::to_string(c.begin) + ", " + std::to_string(c.end) + "), expected it to start at "
                  + std::to_string(expect) + " (a shard's directory is missing?)");
    expect = c.end;
  }
  if (view->job) {
    train_config cfg;
    for (const auto& kv : view->job->settings) {
      const auto eq = kv.find('=');
      if (kv.compare(0, 6, "model.") == 0)
        (void)apply_setting(cfg, kv.substr(0, eq), kv.substr(eq + 1));
    }
    if (!validate(cfg.model) && cfg.model.num_params() != expect)
      return fail("cut " + std::to_string(view->choice->cut) + " holds " + std::to_string(expect)
                  + " parameters, the job's model " + cfg.model.to_string() + " has "
                  + std::to_string(cfg.model.num_params()));
  }
  std::printf("%s: a resume takes cut %" PRIu64 " (%zu shards, %" PRIu64 " parameters; %.1f MB stored)%s%s\n",
              problems == 0 ? "ok" : "DAMAGED", view->choice->cut, cs->size(), expect, bytes / 1e6,
              view->choice->passed_over.empty() ? "" : "; passed over ", view->choice->passed_over.c_str());
  return problems == 0 ? 0 : 1;
}

int show(const checkpoint_options& o) {
  auto shards = open_shards(o.dir);
  auto cs = shards ? chosen(o.dir, *shards, o.cut, o.shard) : expected<std::vector<shard_checkpoint>>{shards.error()};
  if (!cs) {
    std::fprintf(stderr, "ashlar checkpoint show: %s\n", describe(cs.error()).c_str());
    return 1;
  }
  for (const auto& c : *cs) {
    double sq = 0, vsq = 0, lo = INFINITY, hi = -INFINITY;
    for (float x : c.params) {
      sq += double{x} * x;
      lo = std::min<double>(lo, x);
      hi = std::max<double>(hi, x);
    }
    for (float x : c.velocity)
      vsq += double{x} * x;
    double asq = 0;
    for (float x : c.average)
      asq += double{x} * x;
    std::printf("shard %u, cut %" PRIu64 ", version %" PRIu64 ", taken %s, checksum ok\n  parameters [%" PRIu64 ", %" PRIu64
                "): %zu floats, L2 norm %.6g, min %.6g, max %.6g\n  optimizer velocity: L2 norm %.6g\n",
                c.shard_id, c.cut, c.version, local_time(c.unix_ns).c_str(), c.begin, c.end, c.params.size(),
                std::sqrt(sq), lo, hi, std::sqrt(vsq));
    if (!c.average.empty())
      std::printf("  running average: L2 norm %.6g, over %" PRIu64 " samples\n", std::sqrt(asq), c.average_samples);
  }
  return 0;
}

// Writes the whole model's parameters (the shards' ranges in order) as a NumPy .npy
// file of float32: np.load(FILE) in Python, or raw floats after the header.
// The model the checkpointed job trained, from its job record's settings.
expected<model_spec> checkpointed_model(const std::string& dir) {
  auto store = open_rocksdb_store(dir + "/job", open_mode::read_only);
  if (!store)
    return store.error();
  auto rec = load_job_record(**store);
  if (!rec)
    return rec.error();
  if (!*rec)
    return make_error(errc::io_error, dir + "/job holds no job record: the model is unknown (export to .npy instead)");
  train_config cfg;
  for (const auto& kv : (*rec)->settings) {
    const auto eq = kv.find('=');
    const auto key = kv.substr(0, eq);
    if (key.rfind("model.", 0) == 0)
      if (auto err = apply_setting(cfg, key, kv.substr(eq + 1)))
        return err;
  }
  if (auto err = validate(cfg.model))
    return err;
  return cfg.model;
}

// A .npz of the parameters by layer: NAME.weight and NAME.bias shaped as PyTorch's
// Linear, Conv2d and GroupNorm hold them (NAME.params for an external layer), and
// ashlar_model: the model as JSON text (uint8), so ops/ashlar_torch.py rebuilds it.
int export_layers(const checkpoint_options& o, const std::vector<shard_checkpoint>& cs, uint64_t count,
                  bool average) {
  auto fail = [](const caf::error& err) {
    std::fprintf(stderr, "ashlar checkpoint export: %s\n", describe(err).c_str());
    return 1;
  };
  auto model = checkpointed_model(o.dir);
  if (!model)
    return fail(model.error());
  auto plan = compile(*model);
  if (!plan)
    return fail(plan.error());
  if (plan->num_params != count)
    return fail(make_error(errc::shape_mismatch, "the checkpoints hold " + std::to_string(count)
                                                   + " parameters, the job's model " + model->to_string() + " has "
                                                   + std::to_string(plan->num_params)));
  std::vector<float> flat;
  flat.reserve(count);
  for (const auto& c : cs)
    flat.insert(flat.end(), exported(c, average).begin(), exported(c, average).end());
  auto array = [&](uint64_t at, std::vector<uint64_t> shape) {
    npy_array a;
    a.dtype = "<f4";
    a.shape = std::move(shape);
    uint64_t n = 1;
    for (auto d : a.shape)
      n *= d;
    a.bytes.resize(n * 4);
    std::memcpy(a.bytes.data(), flat.data() + at, n * 4);
    return a;
  };
  std::vector<std::pair<std::string, npy_array>> entries;
  std::string layers;
  for (const auto& n : plan->nodes) {
    const auto& l = n.spec;
    layers += std::string{layers.empty() ? "" : ","} + json_string(layers_text({l}));
    switch (l.kind) {
      case layer_kind::dense:
        entries.emplace_back(l.name + ".weight", array(n.weight, {n.out.c, n.in.c}));
        entries.emplace_back(l.name + ".bias", array(n.bias, {n.out.c}));
        break;
      case layer_kind::conv2d:
        entries.emplace_back(l.name + ".weight", array(n.weight, {n.out.c, n.in.c, l.kernel, l.kernel}));
        entries.emplace_back(l.name + ".bias", array(n.bias, {n.out.c}));
        break;
      case layer_kind::groupnorm:
        entries.emplace_back(l.name + ".weight", array(n.weight, {n.in.c}));
        entries.emplace_back(l.name + ".bias", array(n.bias, {n.in.c}));
        break;
      case layer_kind::external:
        entries.emplace_back(l.name + ".params", array(n.weight, {n.weight_size}));
        break;
      default:
        break;
    }
  }
  std::string versions;
  for (const auto& c : cs)
    versions += std::string{versions.empty() ? "" : ","} + std::to_string(c.version);
  const std::string json = "{\"input\":[" + std::to_string(model->input.c) + "," + std::to_string(model->input.h) + ","
                           + std::to_string(model->input.w) + "],\"classes\":" + std::to_string(model->classes)
                           + ",\"layers\":[" + layers + "],\"params\":" + std::to_string(count)
                           + ",\"versions\":[" + versions + "],\"weights\":\""
                           + (average ? "average" : "parameters") + "\"}";
  npy_array meta;
  meta.dtype = "|u1";
  meta.shape = {json.size()};
  meta.bytes.assign(json.begin(), json.end());
  entries.emplace_back("ashlar_model", std::move(meta));
  if (auto err = write_npz(o.out, entries))
    return fail(err);
  std::printf("wrote %" PRIu64 " %s of %s by layer (%zu arrays) to %s\n", count,
              average ? "floats of the running average" : "parameters", model->to_string().c_str(),
              entries.size() - 1, o.out.c_str());
  return 0;
}

int export_params(const checkpoint_options& o) {
  auto shards = open_shards(o.dir);
  auto cs = shards ? chosen(o.dir, *shards, o.cut, -1) : expected<std::vector<shard_checkpoint>>{shards.error()};
  if (!cs) {
    std::fprintf(stderr, "ashlar checkpoint export: %s\n", describe(cs.error()).c_str());
    return 1;
  }
  uint64_t expect = 0;
  for (const auto& c : *cs) {
    if (c.begin != expect) {
      std::fprintf(stderr, "ashlar checkpoint export: shard %u starts at %" PRIu64 ", expected %" PRIu64
                           " (a shard's directory is missing?)\n", c.shard_id, c.begin, expect);
      return 1;
    }
    expect = c.end;
  }
  const bool average = export_average(o, *cs);
  if (o.out.size() > 4 && o.out.compare(o.out.size() - 4, 4, ".npz") == 0)
    return export_layers(o, *cs, expect, average);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(expect) + ",), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream out{o.out, std::ios::binary};
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  for (const auto& c : *cs)
    out.write(reinterpret_cast<const char*>(exported(c, average).data()),
              static_cast<std::streamsize>(exported(c, average).size() * 4));
  out.close();
  if (!out) {
    std::fprintf(stderr, "ashlar checkpoint export: cannot write %s\n", o.out.c_str());
    return 1;
  }
  std::printf("wrote %" PRIu64 " %s (versions", expect, average ? "floats of the running average" : "parameters");
  for (const auto& c : *cs)
    std::printf(" %u:%" PRIu64, c.shard_id, c.version);
  std::printf(") to %s\n", o.out.c_str());
  return 0;
}

// Why `path` must stay (a process holds its store), or nothing; fails on an unreadable lock.
expected<std::optional<std::string>> held_why(const std::string& path) {
  auto pid = store_lock_holder(path);
  if (!pid)
    return pid.error();
  if (!*pid)
    return std::optional<std::string>{};
  auto lease = read_lease(path);
  std::string who = **pid > 0 ? "process " + std::to_string(**pid) : std::string{"a process on another host"};
  if (lease && *lease)
    who += " (its lease names " + lease_holder(**lease) + ")";
  return std::optional<std::string>{"its store is held by " + who + ": stop that process first"};
}

// One look at what a clean may remove: gone meanwhile (a takeover claimed its copy, or
// another clean removed it), held (why it must stay), or what it holds now.
struct clean_look {
  bool gone = false;
  std::optional<std::string> held;
  directory_snapshot seen;
};

expected<clean_look> look_at(const std::string& path) {
  std::error_code ec;
  auto vanished = [&] { return !std::filesystem::exists(path, ec); };
  if (vanished())
    return clean_look{true, {}, {}};
  auto held = held_why(path);
  if (!held)
    return vanished() ? expected<clean_look>{clean_look{true, {}, {}}} : expected<clean_look>{held.error()};
  if (*held)
    return clean_look{false, std::move(*held), {}};
  auto state = directory_state(path);
  if (!state)
    return vanished() ? expected<clean_look>{clean_look{true, {}, {}}} : expected<clean_look>{state.error()};
  return clean_look{false, {}, std::move(*state)};
}

// What the messages of `ashlar checkpoint clean` start with.
constexpr const char* clean_cmd = "ashlar checkpoint clean";

// A directory a clean removes if nothing in it changes while it is watched: why it goes, its
// path, and its state at the first look.
struct clean_candidate {
  clean_item item;
  std::string path;
  std::string state;
};

// The entries of the checkpoint directory --dir: its links and its directories. Returns the
// exit code, 1 when it is not a directory or cannot be listed.
int read_checkpoint_dir(const checkpoint_options& o, std::vector<checkpoint_dir_entry>& entries) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(o.dir, ec)) {
    std::fprintf(stderr, "%s: %s is not a directory (a job's --checkpoint-dir)\n", clean_cmd, o.dir.c_str());
    return 1;
  }
  for (fs::directory_iterator it{o.dir, ec}, end; !ec && it != end; it.increment(ec)) {
    checkpoint_dir_entry d;
    d.name = it->path().filename().string();
    std::error_code le;
    d.link = it->is_symlink(le);
    if (d.link)
      d.target = fs::read_symlink(it->path(), le).string();
    else if (!it->is_directory(le))
      continue;
    entries.push_back(std::move(d));
  }
  if (ec) {
    std::fprintf(stderr, "%s: cannot list %s: %s\n", clean_cmd, o.dir.c_str(), ec.message().c_str());
    return 1;
  }
  return 0;
}

// The first look at each directory the plan removes: one gone meanwhile or held is said and
// left, the others go to `watched`. Returns the exit code, 1 on an error reading one.
int first_look(const checkpoint_options& o, clean_plan& plan, std::vector<clean_candidate>& watched) {
  for (auto& r : plan.remove) {
    const auto path = (std::filesystem::path(o.dir) / r.name).string();
    auto look = look_at(path);
    if (!look) {
      std::fprintf(stderr, "%s: %s\n", clean_cmd, describe(look.error()).c_str());
      return 1;
    }
    if (look->gone)
      std::printf("%s is gone meanwhile\n", r.name.c_str());
    else if (look->held)
      std::printf("kept %s (%s): %s\n", r.name.c_str(), r.why.c_str(), look->held->c_str());
    else
      watched.push_back({std::move(r), path, std::move(look->seen.state)});
  }
  return 0;
}

// Removes each watched directory that no process holds and that did not change while it was
// watched (--dry-run: names it), then says what that freed. Returns the exit code, 1 on an error.
int remove_unchanged(const checkpoint_options& o, const std::vector<clean_candidate>& watched) {
  std::error_code ec;
  uint64_t freed = 0;
  size_t removed = 0;
  for (const auto& c : watched) {
    auto look = look_at(c.path);
    if (!look) {
      std::fprintf(stderr, "%s: %s\n", clean_cmd, describe(look.error()).c_str());
      return 1;
    }
    if (look->gone) {
      std::printf("%s is gone meanwhile\n", c.item.name.c_str());
      continue;
    }
    if (look->held || look->seen.state != c.state) {
      std::printf("kept %s (%s): %s\n", c.item.name.c_str(), c.item.why.c_str(),
                  look->held ? look->held->c_str() : "it was written to while watched: a process still uses it");
      continue;
    }
    const uint64_t bytes = look->seen.bytes;
    if (o.dry_run) {
      std::printf("would remove %s (%s): %.1f MB\n", c.item.name.c_str(), c.item.why.c_str(), bytes / 1e6);
      continue;
    }
    const auto count = std::filesystem::remove_all(c.path, ec);
    if (!ec && count == 0) {
      std::printf("%s is gone meanwhile\n", c.item.name.c_str());
      continue;
    }
    if (ec) {
      std::fprintf(stderr, "%s: cannot remove %s: %s\n", clean_cmd, c.path.c_str(), ec.message().c_str());
      return 1;
    }
    std::printf("removed %s (%s): %.1f MB\n", c.item.name.c_str(), c.item.why.c_str(), bytes / 1e6);
    freed += bytes;
    ++removed;
  }
  if (!o.dry_run)
    std::printf("removed %zu director%s, %.1f MB\n", removed, removed == 1 ? "y" : "ies", freed / 1e6);
  return 0;
}

// Removes what takeovers left behind: generations no link points to any more and copies
// never claimed (store_clean.hpp), each only if no process holds its store and nothing in
// it changes while it is watched (a holder on another host renews its lease every half
// second). Exit 1 on an error reading the directory.
int clean(const checkpoint_options& o) {
  std::vector<checkpoint_dir_entry> entries;
  if (int code = read_checkpoint_dir(o, entries))
    return code;
  auto plan = plan_clean(entries);
  for (const auto& k : plan.keep)
    std::printf("kept %s: %s\n", k.name.c_str(), k.why.c_str());
  std::vector<clean_candidate> watched;
  if (int code = first_look(o, plan, watched))
    return code;
  if (watched.empty()) {
    std::printf("nothing to remove in %s\n", o.dir.c_str());
    return 0;
  }
  std::printf("watching %zu director%s for %.0f s: a process still writing there keeps it\n", watched.size(),
              watched.size() == 1 ? "y" : "ies", o.watch);
  std::fflush(stdout);
  pause_for(std::chrono::duration<double>(o.watch));
  return remove_unchanged(o, watched);
}

}  // namespace

command_fn add_checkpoint(CLI::App& app) {
  auto o = std::make_shared<checkpoint_options>();
  auto which = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("checkpoint", "List, verify, inspect, export or clean a job's checkpoints "
                                               "(its --checkpoint-dir)");
  cmd->require_subcommand(1);
  auto* ls = cmd->add_subcommand("list", "every stored checkpoint: shard, cut, version, time, size, checksum; "
                                         "the job's record; the cut a resume takes");
  ls->add_option("dir", o->dir, "the checkpoint directory")->required();
  ls->callback([which] { *which = "list"; });
  auto* sh = cmd->add_subcommand("show", "one checkpoint per shard: range, version, parameter statistics");
  sh->add_option("dir", o->dir, "the checkpoint directory")->required();
  sh->add_option("--shard", o->shard, "only this shard");
  sh->add_option("--cut", o->cut, "this checkpoint cut (default: the one a resume takes)");
  sh->callback([which] { *which = "show"; });
  auto* ex = cmd->add_subcommand("export", "write the model's parameters: FILE.npy, one flat float32 vector; "
                                           "FILE.npz, by layer name (NAME.weight, NAME.bias as PyTorch shapes them) "
                                           "with the layer list (ashlar_model, JSON)");
  ex->add_option("dir", o->dir, "the checkpoint directory")->required();
  ex->add_option("--out", o->out, "the .npy or .npz file to write")->required();
  ex->add_option("--cut", o->cut, "this checkpoint cut (default: the one a resume takes)");
  ex->add_flag("--params", o->params, "the parameters themselves, not the running average the job evaluated "
                                      "(train.average_epochs; the default where every shard stored one)");
  ex->callback([which] { *which = "export"; });
  auto* ve = cmd->add_subcommand("verify", "check a checkpoint directory end to end: every store and record, the "
                                           "job record's cuts against the shards', the model's size; exit 1 if "
                                           "anything is damaged, saying whether and from which cut a resume works");
  ve->add_option("dir", o->dir, "the checkpoint directory")->required();
  ve->callback([which] { *which = "verify"; });
  auto* cl = cmd->add_subcommand("clean", "remove what takeovers of a shard's store left behind: generations its "
                                          "link no longer points to, copies never claimed; only where no process "
                                          "holds the store and nothing is written while watched");
  cl->add_option("dir", o->dir, "the checkpoint directory")->required();
  cl->add_option("--watch", o->watch, "seconds to watch each directory for writes (default: the lease's stale "
                                      "time, " + std::to_string(static_cast<int>(lease_stale_s)) + " s)")
    ->check(CLI::Range(1.0, 3600.0)); // at least two renewals of a holder's lease
  cl->add_flag("--dry-run", o->dry_run, "say what would be removed, remove nothing");
  cl->callback([which] { *which = "clean"; });
  return [o, which] {
    if (*which == "clean")
      return clean(*o);
    if (*which == "list")
      return list(*o);
    if (*which == "show")
      return show(*o);
    if (*which == "verify")
      return verify(*o);
    return export_params(*o);
  };
}

}  // namespace ashlar::cli
