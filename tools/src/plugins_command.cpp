// `devalloc plugins`: every candidate plugin on the search path, whether it
// loaded or why not, and the devices of those that did; with --config, as
// that config's runtime would load them (its plugin_path, options, layers
// and trust, and its aliases).
#include "commands.hpp"
#include "inputs.hpp"
#include "json_output.hpp"

#include <devalloc/core/device_registry.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/plugin_loader.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace devalloc::cli {

namespace {

struct PluginsOptions {
  std::string config;
  std::vector<std::string> plugin_path;
  std::vector<std::string> trust_paths;
  bool json = false;
};

// The validation layer's checks on a loaded plugin ("calls", "releases",
// "sources"); empty when it runs without validation.
std::vector<std::string> validation_checks(const Plugin& plugin) {
  const auto settings = plugin.layer_settings();
  return settings && settings->validate ? settings->check_names() : std::vector<std::string>();
}

nlohmann::json device_json(const DeviceInfo& d) {
  return {{"index", d.index},
          {"name", d.name},
          {"total_memory_bytes", d.total_memory_bytes},
          {"uuid", d.has_uuid() ? d.uuid_string() : ""},
          {"pci_bus_id", d.pci_bus_id},
          {"dlpack_device_type", d.dlpack_device_type},
          {"dlpack_device_id", d.dlpack_device_id},
          {"memory_kind", d.memory_kind}};
}

// Every plugin the config names that discovery did not create as the
// config would: aliases of a library file, and names not on the path.
void add_configured(const RuntimeConfig& config, const PluginLoader& loader,
                    std::vector<PluginCandidate>& candidates) {
  for (const auto& [name, pc] : config.plugins) {
    const bool discovered =
        !pc.library && std::any_of(candidates.begin(), candidates.end(),
                                   [&](const PluginCandidate& c) { return c.name == name; });
    if (discovered) continue;
    PluginCandidate c;
    c.name = name;
    c.source = PluginPathSource::config;
    auto [plugin, error] = loader.load(pc.load_spec(), pc.options, pc.layers, pc.trust);
    if (plugin) {
      c.outcome = PluginOutcome::loaded;
      c.path = plugin->path();
      c.plugin = std::move(plugin);
    } else {
      c.outcome = error.outcome;
      c.reason = error.status.message();
      c.code = error.status.code();
      if (pc.library) c.path = *pc.library;
    }
    candidates.push_back(std::move(c));
  }
}

int run_plugins(const PluginsOptions& options) {
  auto config = config_from(options.config, options.trust_paths);
  if (!config.ok()) return report_failure("plugins", config.status());
  PluginSearchOptions search = plugin_search_options(*config);
  search.command_line_dirs.assign(options.plugin_path.begin(),
                                  options.plugin_path.end());
  PluginLoader loader(search);
  std::map<std::string, PluginLoadSettings, std::less<>> settings;
  for (const auto& [name, pc] : config->plugins) {
    PluginLoadSettings& use = settings[name];
    if (!pc.library) {
      use.options = pc.options;
      use.layers = pc.layers;
      use.trusted = pc.trust;
    } else {
      // The runtime loads this name from the library alone: a file of the
      // name on the path is never used, as if found later on the path.
      use.shadowed_by = "[plugins." + escaped(name) + "] library = " +
                        quote(pc.library->string(), 4096) + " (" +
                        path_for_message(pc.where.to_string()) + ") is used for " +
                        quote(name) + " instead";
    }
  }
  auto candidates = loader.discover(settings);
  const size_t first_added = candidates.size();
  add_configured(*config, loader, candidates);
  // Where a listed plugin's settings come from, for the listing: a file
  // found on the path only when its entry names no library (an alias of
  // the same name is listed apart, after the files).
  auto configured_at = [&](const PluginCandidate& c) -> std::string {
    const auto it = config->plugins.find(c.name);
    if (it == config->plugins.end() || c.outcome == PluginOutcome::shadowed) return "";
    const bool added = &c >= candidates.data() + first_added;
    if (it->second.library && !added) return "";
    return it->second.where.to_string();
  };

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
                          {"reason", c.reason},
                          {"configured_at", configured_at(c)}};
      if (c.plugin) {
        p["file"] = c.plugin->path().string();  // the file opened, links resolved
        p["version"] = c.plugin->version();
        p["abi"] = std::to_string(c.plugin->abi_major()) + "." +
                   std::to_string(c.plugin->abi_minor());
        const std::vector<std::string> checks = validation_checks(*c.plugin);
        p["validation"] = {{"on", !checks.empty()}, {"checks", checks}};
        p["devices"] = nlohmann::json::array();
        for (const auto& d : c.plugin->devices()) p["devices"].push_back(device_json(d));
      }
      out["plugins"].push_back(std::move(p));
    }
    std::printf("%s\n", json_text(out).c_str());
    return kExitOk;
  }

  std::printf("plugin search path:\n");
  for (const auto& d : loader.search_dirs()) {
    std::printf("  %s (%s)\n", path_for_message(d.dir.string()).c_str(), to_string(d.source));
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
      std::printf("\n%-12s %s\n", escaped(c.name).c_str(),
                  unavailable ? "unavailable (vendor runtime missing)" : to_string(c.outcome));
      if (!c.path.empty()) std::printf("  %s\n", path_for_message(c.path.string()).c_str());
      if (const std::string at = configured_at(c); !at.empty()) {
        std::printf("  configured at %s\n", path_for_message(at).c_str());
      }
      std::printf("  %s\n", c.reason.c_str());
      continue;
    }
    // The version is escaped by the loader already; the device names and
    // PCI bus ids below come from the plugin raw.
    // A symbolic link is shown with the file it led to, the one opened.
    const std::string opened = c.plugin->path() == c.path
                                   ? std::string()
                                   : " -> " + path_for_message(c.plugin->path().string());
    std::printf("\n%-12s loaded (plugin %s, ABI %u.%u)\n  %s%s\n", escaped(c.name).c_str(),
                c.plugin->version().c_str(), c.plugin->abi_major(), c.plugin->abi_minor(),
                path_for_message(c.path.string()).c_str(), opened.c_str());
    if (const std::string at = configured_at(c); !at.empty()) {
      std::printf("  configured at %s\n", path_for_message(at).c_str());
    }
    if (const std::vector<std::string> checks = validation_checks(*c.plugin); !checks.empty()) {
      std::string list;
      for (const auto& check : checks) list += (list.empty() ? "" : ", ") + check;
      std::printf("  validation layer on (checks: %s)\n", list.c_str());
    }
    if (c.plugin->devices().empty()) std::printf("  no devices\n");
    for (const auto& d : c.plugin->devices()) {
      std::printf("  [%u] %s, %s", d.index, escaped(d.name).c_str(),
                  human_bytes(d.total_memory_bytes).c_str());
      if (d.has_uuid()) std::printf(", uuid %s", d.uuid_string().c_str());
      if (!d.pci_bus_id.empty()) std::printf(", pci %s", escaped(d.pci_bus_id).c_str());
      if (!d.memory_kind.empty()) std::printf(", memory %s", escaped(d.memory_kind).c_str());
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
  add_config_option(cmd, &options->config,
                    "A runtime config: its plugin_path is searched and its [plugins] "
                    "options, layers and trust are used");
  add_plugin_path_option(cmd, &options->plugin_path);
  add_trust_plugin_path_option(cmd, &options->trust_paths);
  cmd->add_flag("--json", options->json, "Machine-readable output");
  cmd->callback([run, options] { *run = [options] { return run_plugins(*options); }; });
}

}  // namespace devalloc::cli
