// The `ashlar` command line: its commands, help, completion and errors (run_cli).
#include <algorithm>
#include <cstdio>
#include <optional>

#include "apps/ashlar/commands.hpp"
#include "apps/ashlar/host.hpp"
#include "runtime/config/train_config.hpp"
#include "runtime/core/suggest.hpp"
#include "runtime/policy/sync_policy.hpp"

namespace {

// What a TEXT option takes, by its name, for --help (the values are read as text and
// checked by the configuration, so CLI11 sees strings).
const char* value_kind(const std::string& name) {
  static const std::pair<const char*, const char*> kinds[] = {
    {"--workers", "N"}, {"--servers", "N"}, {"--epochs", "N"}, {"--seed", "N"}, {"--batch-size", "N"},
    {"--checkpoint-every", "ROUNDS"}, {"--lr", "FLOAT"}, {"--policy", "POLICY"}, {"--log-level", "LEVEL"},
    {"--gpus", "auto|none|IDS"}, {"--set", "KEY=VALUE"}, {"--join", "HOST:PORT"}, {"--listen", "HOST:PORT"},
    {"--metrics-listen", "HOST:PORT"}, {"--data-host", "HOST"}, {"--role", "ROLES"}, {"--name", "NAME"},
    {"--report", "FILE"}, {"--trace", "FILE"}, {"--metrics", "FILE"}, {"--token-file", "FILE"},
    {"--port-file", "FILE"}, {"--ca", "DIR"}, {"--tls", "DIR"}, {"--out", "PATH"}, {"--data-dir", "DIR"},
    {"--node-data-dir", "DIR"}, {"--checkpoint-dir", "DIR"}, {"--work-dir", "DIR"},
  };
  for (const auto& [n, k] : kinds)
    if (name == n)
      return k;
  return nullptr;
}

void name_value_kinds(CLI::App& app) {
  for (auto* opt : app.get_options()) {
    if (opt->get_type_name() == "TEXT:FILE")
      opt->type_name("TOML"); // a positional CONFIG that must exist: "TOML:FILE"
    if (opt->get_type_name() == "TEXT")
      for (const auto& n : opt->get_lnames())
        if (auto* k = value_kind("--" + n))
          opt->type_name(k);
  }
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; }))
    name_value_kinds(*sub);
}

// A bash completion script for every command and option of `app`:
//   source <(ashlar completion bash)
std::string bash_completion(CLI::App& app) {
  std::string subs, cases;
  auto opts_of = [](CLI::App* a) {
    std::string out;
    for (auto* o : a->get_options())
      for (const auto& n : o->get_lnames())
        out += (out.empty() ? "--" : " --") + n;
    return out;
  };
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    subs += (subs.empty() ? "" : " ") + sub->get_name();
    std::string words = opts_of(sub), names, inner_cases;
    for (auto* inner : sub->get_subcommands([](CLI::App*) { return true; })) {
      names += " " + inner->get_name();
      inner_cases += inner->get_name() + ") words=\"" + opts_of(inner) + "\" ;; ";
    }
    if (names.empty())
      cases += "    " + sub->get_name() + ") words=\"" + words + "\" ;;\n";
    else // `ashlar config show --<TAB>`: show's options; `ashlar config <TAB>`: its commands
      cases += "    " + sub->get_name() + ") inner=1; case ${COMP_WORDS[2]} in " + inner_cases + "*) words=\""
               + words + names + "\" ;; esac ;;\n";
  }
  std::string policies, keys;
  for (const auto& n : ashlar::policy_names())
    policies += (policies.empty() ? "" : " ") + n;
  for (const auto& k : ashlar::config_keys())
    keys += (keys.empty() ? "" : " ") + k.key + "=";
  return "# bash completion for ashlar: source <(ashlar completion bash)\n"
         "_ashlar() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} words inner=0\n"
         "  case $prev in\n"
         "    --policy) COMPREPLY=($(compgen -W \"" + policies + "\" -- \"$cur\")); return ;;\n"
         "    --set) compopt -o nospace 2>/dev/null; COMPREPLY=($(compgen -W \"" + keys + "\" -- \"$cur\")); return ;;\n"
         "    --gpus) COMPREPLY=($(compgen -W \"auto none\" -- \"$cur\")); return ;;\n"
         "    --log-level) COMPREPLY=($(compgen -W \"trace debug info warn error off\" -- \"$cur\")); return ;;\n"
         "  esac\n"
         "  if [ \"$COMP_CWORD\" -eq 1 ]; then\n"
         "    COMPREPLY=($(compgen -W \"" + subs + " help version completion --help --version\" -- \"$cur\"))\n"
         "    return\n"
         "  fi\n"
         "  case ${COMP_WORDS[1]} in\n" + cases +
         "    help) words=\"" + subs + "\" ;;\n"
         "    *) words=\"\" ;;\n"
         "  esac\n"
         "  if [[ $cur == -* || ( ( ${COMP_WORDS[1]} == help || $inner == 1 ) && $COMP_CWORD -eq 2 ) ]]; then\n"
         "    COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
         "  else\n"
         "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  fi\n"
         "}\n"
         "complete -F _ashlar ashlar\n";
}

// A command that takes a command of its own (`ashlar`, `ashlar config`, `ashlar ctl`, ...)
// given none or an unknown one: what to say instead of CLI11's error ("A subcommand is
// required", "--join is required", "arguments were not expected"). Empty where a command
// without commands of its own failed to parse: CLI11's error names what.
std::string missing_subcommand(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (auto* sub : at->get_subcommands([](CLI::App*) { return true; }))
      if (sub->parsed()) {
        at = sub;
        deeper = true;
        break;
      }
  }
  auto subs = at->get_subcommands([](CLI::App*) { return true; });
  if (subs.empty())
    return ""; // a command without commands of its own: CLI11's error stands
  std::string path = at == &app ? "ashlar" : "ashlar " + at->get_name();
  if (at != &app && at->get_parent() != &app)
    path = "ashlar " + at->get_parent()->get_name() + " " + at->get_name();
  std::vector<std::string> names;
  std::string list;
  for (auto* sub : subs) {
    names.push_back(sub->get_name());
    const auto& n = sub->get_name();
    list += "  " + n + std::string(n.size() < 15 ? 15 - n.size() : 1, ' ') + sub->get_description() + "\n";
  }
  if (at == &app)
    list += "  help CMD       one command's options\n  version        the build's facts\n"
            "  completion     bash completion: source <(ashlar completion bash)\n";
  // The word given where the command was expected, if any.
  std::string word;
  for (int i = 1; i + 1 < argc && at != &app; ++i)
    if (argv[i] == at->get_name()) {
      for (int j = i + 1; j < argc && word.empty(); ++j)
        if (argv[j][0] != '-')
          word = argv[j];
      break;
    }
  if (!word.empty())
    return path + ": unknown command '" + word + "'" + ashlar::did_you_mean(word, names) + "; commands:\n" + list;
  return path + ": which one? (`" + path + " CMD --help` for one)\n" + list;
}

// `ashlar completion bash`: the script bash sources. Returns the exit code.
int run_completion(CLI::App& app, int argc, char** argv) {
  if (argc < 3 || std::string{argv[2]} != "bash") {
    std::fprintf(stderr, "ashlar completion: only bash is supported: source <(ashlar completion bash)\n");
    return 2;
  }
  std::printf("%s", bash_completion(app).c_str());
  return 0;
}

// `ashlar help [CMD]`: the help of every command, or of command CMD (one of `names`).
// Returns the exit code.
int run_help(CLI::App& app, int argc, char** argv, const std::vector<std::string>& names) {
  if (argc < 3) {
    std::printf("%s", app.help().c_str());
    return 0;
  }
  const std::string what = argv[2];
  if (what == "completion") {
    std::printf("ashlar completion bash: a bash completion script for every command, option and value\n"
                "(policy names after --policy, configuration keys after --set). Load it with\n"
                "  source <(ashlar completion bash)\n");
    return 0;
  }
  if (what == "version") {
    std::printf("ashlar version: the build's facts (version, compiler, libraries, GPU support)\n");
    return 0;
  }
  if (what == "help") {
    std::printf("ashlar help [CMD]: every command, or one command's options\n");
    return 0;
  }
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == what) {
      std::printf("%s", sub->help().c_str());
      return 0;
    }
  std::fprintf(stderr, "ashlar help: unknown command '%s'%s; commands: %s\n", what.c_str(),
               ashlar::did_you_mean(what, names).c_str(), CLI::detail::join(names, ", ").c_str());
  return 2;
}

// `ashlar help [CMD]`, `ashlar version`, `ashlar completion bash`, and a mistyped command
// named as such: the exit code when the first argument is one of these; none when it is a
// command (or an option) for CLI11 to parse.
std::optional<int> run_first_word(CLI::App& app, int argc, char** argv, const std::string& version) {
  if (argc < 2 || argv[1][0] == '-')
    return std::nullopt;
  const std::string word = argv[1];
  std::vector<std::string> names;
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  if (word == "completion")
    return run_completion(app, argc, argv);
  if (word == "version") {
    std::printf("%s\n", version.c_str());
    return 0;
  }
  if (word == "help")
    return run_help(app, argc, argv, names);
  if (std::find(names.begin(), names.end(), word) == names.end()) {
    for (auto w : {"help", "version", "completion"})
      names.push_back(w);
    std::fprintf(stderr, "ashlar: unknown command '%s'%s; commands: %s (`ashlar help CMD` for one)\n",
                 word.c_str(), ashlar::did_you_mean(word, names).c_str(), CLI::detail::join(names, ", ").c_str());
    return 2;
  }
  return std::nullopt;
}

// The command the leading words of `argv` select (`ashlar ctl stop-job ...`: stop-job).
CLI::App* chosen_command(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    CLI::App* next = nullptr;
    for (auto* sub : at->get_subcommands([](CLI::App*) { return true; }))
      if (sub->get_name() == argv[i])
        next = sub;
    if (next == nullptr)
      break;
    at = next;
  }
  return at;
}

// A long option the chosen command does not have (`--epoch 1`, `--polcy bsp`): named, with
// the nearest one it has, before CLI11 reads its value as a positional argument and says
// something else ("arguments were not expected: 1", "File does not exist: bsp"). Empty
// when every option is known.
std::string unknown_option(CLI::App& app, int argc, char** argv) {
  CLI::App* at = chosen_command(app, argc, argv);
  if (at == &app)
    return "";
  std::vector<std::string> names;
  std::vector<std::string> valued; // options that take a value: the next word is theirs
  for (CLI::App* a = at; a != nullptr; a = a->get_parent())
    for (auto* o : a->get_options())
      for (const auto& n : o->get_lnames()) {
        names.push_back("--" + n);
        if (o->get_items_expected_min() > 0)
          valued.push_back("--" + n);
      }
  std::string path = "ashlar " + at->get_name();
  if (at->get_parent() != &app)
    path = "ashlar " + at->get_parent()->get_name() + " " + at->get_name();
  for (int i = 1; i < argc; ++i) {
    const std::string w = argv[i];
    if (w == "--")
      break;
    if (w.size() < 3 || w.compare(0, 2, "--") != 0)
      continue;
    const std::string name = w.substr(0, w.find('='));
    if (std::find(names.begin(), names.end(), name) == names.end())
      return path + ": unknown option '" + name + "'" + ashlar::did_you_mean(name, names) + "; `" + path
             + " --help` lists them\n";
    if (w.find('=') == std::string::npos && std::find(valued.begin(), valued.end(), name) != valued.end())
      ++i; // its value, whatever it looks like
  }
  return "";
}

// Parses the command line: the exit code when that ends the run (--help, --version, an
// error); none when a command is to run.
std::optional<int> parse_args(CLI::App& app, int argc, char** argv) {
  if (auto why = unknown_option(app, argc, argv); !why.empty()) {
    std::fprintf(stderr, "%s", why.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end the parse as "errors" too, with exit code 0.
    if (e.get_exit_code() == 0)
      return app.exit(e);
    if (auto why = missing_subcommand(app, argc, argv); !why.empty()) {
      std::fprintf(stderr, "%s", why.c_str());
      return 2;
    }
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace

int ashlar::cli::run_cli(int argc, char** argv) {
  CLI::App app{"ashlar: heterogeneity-aware data-parallel training on an actor runtime"};
  app.require_subcommand(1);
  const std::string version = ashlar::cli::version_text();
  app.set_version_flag("--version", version);
  auto train = ashlar::cli::add_train(app);
  auto bench = ashlar::cli::add_bench(app);
  auto node = ashlar::cli::add_node(app);
  auto launch = ashlar::cli::add_launch(app);
  auto status = ashlar::cli::add_status(app);
  auto ctl = ashlar::cli::add_ctl(app);
  auto checkpoint = ashlar::cli::add_checkpoint(app);
  auto cert = ashlar::cli::add_cert(app);
  auto config = ashlar::cli::add_config(app);
  name_value_kinds(app);
  // `ashlar launch ... --python SCRIPT -- ARGS`: ARGS are the script's, not options of launch.
  ashlar::cli::launch_script_args().clear();
  if (argc > 1 && std::string{argv[1]} == "launch")
    for (int i = 2; i < argc; ++i)
      if (std::string{argv[i]} == "--") {
        ashlar::cli::launch_script_args().assign(argv + i + 1, argv + argc);
        argc = i;
        break;
      }
  // `ashlar help [CMD]`, `ashlar version`, and a mistyped command named as such.
  if (auto code = run_first_word(app, argc, argv, version))
    return *code;
  if (auto code = parse_args(app, argc, argv))
    return *code;
  if (app.got_subcommand("train"))
    return train();
  if (app.got_subcommand("bench"))
    return bench();
  if (app.got_subcommand("node"))
    return node();
  if (app.got_subcommand("launch"))
    return launch();
  if (app.got_subcommand("status"))
    return status();
  if (app.got_subcommand("ctl"))
    return ctl();
  if (app.got_subcommand("checkpoint"))
    return checkpoint();
  if (app.got_subcommand("cert"))
    return cert();
  if (app.got_subcommand("config"))
    return config();
  return 2;
}
