// Finding plugins: by explicit path, or by name on a search path.
//
// Search order for a name ("cuda" -> "libdevalloc_cuda.so"):
//   1. directories given by the caller (the runtime config's plugin_path),
//   2. DEVALLOC_PLUGIN_PATH (colon-separated; read with secure_getenv, so it
//      is ignored in setuid programs),
//   3. the installed plugin folder, ../lib/devalloc/plugins relative to the
//      binary that contains the loader.
// The current directory is never searched implicitly.
#pragma once

#include <devalloc/plugin.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc {

// Letters, digits, '_' and '-': the part NAME of libdevalloc_NAME.so.
bool is_valid_plugin_name(std::string_view name);

// What happened to one candidate file.
struct PluginCandidate {
  std::string name;             // "host" for libdevalloc_host.so
  std::filesystem::path path;   // absolute
  PluginOutcome outcome = PluginOutcome::not_found;
  std::string reason;           // empty when loaded
  StatusCode code = StatusCode::ok;  // runtime_unavailable: no vendor runtime
  std::shared_ptr<Plugin> plugin;  // set when loaded
};

class PluginLoader {
 public:
  // Uses default_search_path(extra_dirs).
  explicit PluginLoader(std::vector<std::filesystem::path> extra_dirs = {});

  // extra_dirs, then DEVALLOC_PLUGIN_PATH, then installed_plugin_dir().
  static std::vector<std::filesystem::path> default_search_path(
      const std::vector<std::filesystem::path>& extra_dirs);
  // ../lib/devalloc/plugins next to the binary containing the loader.
  static std::filesystem::path installed_plugin_dir();
  // "libdevalloc_" + name + ".so"
  static std::string file_name_for(const std::string& name);

  const std::vector<std::filesystem::path>& search_path() const {
    return search_path_;
  }

  // A spec containing '/' or ending in ".so" is a path (made absolute);
  // anything else is a plugin name looked up on the search path.
  std::pair<std::filesystem::path, PluginError> resolve(
      const std::string& name_or_path) const;

  // resolve + PluginLibrary::open + Plugin::create (with layers).
  std::pair<std::shared_ptr<Plugin>, PluginError> load(
      const std::string& name_or_path,
      const PluginOptions& options = {},
      const LayerSettings& layers = {}) const;

  // Every libdevalloc_*.so on the search path, each opened and created with
  // no options; a later file of a name already seen is listed as shadowed.
  std::vector<PluginCandidate> discover() const;

 private:
  std::vector<std::filesystem::path> search_path_;
};

}  // namespace devalloc
