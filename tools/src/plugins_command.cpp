// `devalloc plugins`: every candidate plugin on the search path, whether it
// loaded or why not, and the devices of those that did.
#include "commands.hpp"
#include "inputs.hpp"

#include <devalloc/plugin_loader.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace devalloc::cli {

namespace {

struct PluginsOptions {
  std::vector<std::string> plugin_path;
  std::vector<std::string> trust_paths;
  bool json = false;
};

nlohmann::json device_json(const DeviceInfo& d) {
  return {{"index", d.index},
          {"name", d.name},
          {"total_memory_bytes", d.total_memory_bytes},
          {"uuid", d.has_uuid() ? d.uuid_string() : ""},
          {"pci_bus_id", d.pci_bus_id},
          {"dlpack_device_type", d.dlpack_device_type},
          {"dlpack_device_id", d.dlpack_device_id}};
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB",
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

int run_plugins(const PluginsOptions& options) {
  PluginSearchOptions search;
  search.command_line_dirs.assign(options.plugin_path.begin(),
                                  options.plugin_path.end());
  search.trusted_paths.assign(options.trust_paths.begin(),
                              options.trust_paths.end());
  PluginLoader loader(search);
  const auto candidates = loader.discover();

  if (options.json) {
    nlohmann::json out;
    out["search_path"] = nlohmann::json::array();
    for (const auto& d : loader.search_path()) out["search_path"].push_back(d.string());
    out["search_sources"] = nlohmann::json::array();
    for (const auto& d : loader.search_dirs()) out["search_sources"].push_back(to_string(d.source));
    out["notes"] = loader.notes();
    out["plugins"] = nlohmann::json::array();
    for (const auto& c : candidates) {
      nlohmann::json p = {{"name", c.name},
                          {"path", c.path.string()},
                          {"status", to_string(c.outcome)},
                          {"code", to_string(c.code)},
                          {"reason", c.reason}};
      if (c.plugin) {
        p["version"] = c.plugin->version();
        p["abi"] = std::to_string(c.plugin->abi_major()) + "." +
                   std::to_string(c.plugin->abi_minor());
        p["devices"] = nlohmann::json::array();
        for (const auto& d : c.plugin->devices()) p["devices"].push_back(device_json(d));
      }
      out["plugins"].push_back(std::move(p));
    }
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }

  std::printf("plugin search path:\n");
  for (const auto& d : loader.search_dirs()) {
    std::printf("  %s (%s)\n", d.dir.c_str(), to_string(d.source));
  }
  for (const auto& note : loader.notes()) std::printf("note: %s\n", note.c_str());
  if (candidates.empty()) {
    std::printf("no plugins found (libdevalloc_*.so)\n");
    return kExitOk;
  }
  for (const auto& c : candidates) {
    if (!c.plugin) {
      // A plugin whose vendor runtime is absent is a normal sight on a
      // machine without that hardware: say so plainly.
      const bool unavailable = c.outcome == PluginOutcome::create_failed &&
                               c.code == StatusCode::runtime_unavailable;
      std::printf("\n%-12s %s\n  %s\n  %s\n", c.name.c_str(),
                  unavailable ? "unavailable (vendor runtime missing)" : to_string(c.outcome),
                  c.path.c_str(), c.reason.c_str());
      continue;
    }
    std::printf("\n%-12s loaded (plugin %s, ABI %u.%u)\n  %s\n", c.name.c_str(),
                c.plugin->version().c_str(), c.plugin->abi_major(),
                c.plugin->abi_minor(), c.path.c_str());
    if (c.plugin->devices().empty()) std::printf("  no devices\n");
    for (const auto& d : c.plugin->devices()) {
      std::printf("  [%u] %s, %s", d.index, d.name.c_str(),
                  gib(d.total_memory_bytes).c_str());
      if (d.has_uuid()) std::printf(", uuid %s", d.uuid_string().c_str());
      if (!d.pci_bus_id.empty()) std::printf(", pci %s", d.pci_bus_id.c_str());
      std::printf("\n");
    }
  }
  return kExitOk;
}

}  // namespace

void add_plugins_command(CLI::App& app, Action* run) {
  auto options = std::make_shared<PluginsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plugins", "List every plugin on the search path: loaded, or why not");
  cmd->add_option("--plugin-path", options->plugin_path,
                  "Extra directory searched first (repeatable)");
  add_trust_plugin_path_option(cmd, &options->trust_paths);
  cmd->add_flag("--json", options->json, "Machine-readable output");
  cmd->callback([run, options] { *run = [options] { return run_plugins(*options); }; });
}

}  // namespace devalloc::cli
