// `devalloc conformance PLUGIN`: the shared conformance suite against one
// plugin, as a vendor runs it on their own .so. Exit 0 when every test passed.
#include "commands.hpp"

#include <devalloc/conformance.hpp>
#include <devalloc/input_text.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace devalloc::cli {

namespace {

struct ConformanceOptions {
  std::string plugin;
  std::vector<std::string> options;  // key=value
};

int run_conformance(const ConformanceOptions& o,
                    const std::vector<std::string>& gtest_args) {
  conformance::Target target;
  target.plugin = o.plugin;
  for (const auto& kv : o.options) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "devalloc conformance: --option %s: expected KEY=VALUE\n",
                   quote(kv).c_str());
      return kExitUsage;
    }
    std::string key = kv.substr(0, eq);
    for (const auto& [known, value] : target.options) {
      if (known == key) {
        std::fprintf(stderr, "devalloc conformance: --option %s is given twice\n",
                     quote(key).c_str());
        return kExitUsage;
      }
    }
    target.options.emplace_back(std::move(key), kv.substr(eq + 1));
  }
  std::vector<std::string> storage{"devalloc conformance"};
  storage.insert(storage.end(), gtest_args.begin(), gtest_args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  // run() already answers 0 (passed), 1 (failed) or 2 (bad argument).
  return conformance::run(target, static_cast<int>(storage.size()), argv.data());
}

}  // namespace

void add_conformance_command(CLI::App& app, Action* run) {
  auto options = std::make_shared<ConformanceOptions>();
  CLI::App* cmd = app.add_subcommand(
      "conformance",
      "Run the plugin conformance suite against PLUGIN (a name or a path); "
      "extra --gtest_* flags are passed to GoogleTest");
  cmd->add_option("plugin", options->plugin, "Plugin name (e.g. host) or path to a .so")
      ->required();
  cmd->add_option("--option", options->options,
                  "KEY=VALUE passed to the plugin's create (repeatable)");
  cmd->allow_extras();
  cmd->callback([run, options, cmd] {
    const std::vector<std::string> extras = cmd->remaining();
    *run = [options, extras] { return run_conformance(*options, extras); };
  });
}

}  // namespace devalloc::cli
