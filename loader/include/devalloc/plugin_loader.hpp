// Finding plugins: by explicit path, or by name on a search path.
//
// Search order for a name ("cuda" -> "libdevalloc_cuda.so"):
//   1. --plugin-path folders (command_line_dirs),
//   2. the runtime config's plugin_path (config_dirs),
//   3. DEVALLOC_PLUGIN_PATH (colon-separated),
//   4. a program's own plugin folders (fallback_dirs: the Python package's),
//      so that the user's folders above can replace what it bundles,
//   5. the installed plugin folder, ../lib/devalloc/plugins relative to the
//      binary that contains the loader (installed_plugin_dir()), when it
//      exists; otherwise notes() says there is none and what to do (a
//      program that links the loader from outside devalloc's prefix).
// The current directory is never searched implicitly. While the process
// runs with elevated privileges (effective ids differ from the real ones, or
// AT_SECURE), 1-4 are ignored and an explicit path outside the installed
// folder is refused; notes() says so. Every file is checked by
// check_plugin_file (plugin_trust.hpp) before it is opened.
#pragma once

#include <devalloc/plugin.hpp>
#include <devalloc/plugin_trust.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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
  PluginPathSource source = PluginPathSource::installed;  // of its folder
};

// How discover() creates the plugin of one name: the options, layers and
// trust a runtime config's [plugins.NAME] gives it.
struct PluginLoadSettings {
  PluginOptions options;
  LayerSettings layers{};
  bool trusted = false;
  // Set when the name is taken by a file given apart from the search path
  // (a config's [plugins.NAME] library): every file of the name on the path
  // is then listed as shadowed, with this as the reason, and not opened.
  std::string shadowed_by;
};

// One folder of the search path and where it came from.
struct PluginSearchDir {
  std::filesystem::path dir;  // absolute
  PluginPathSource source;
};

struct PluginSearchOptions {
  std::vector<std::filesystem::path> command_line_dirs;  // --plugin-path
  std::vector<std::filesystem::path> config_dirs;        // plugin_path
  // A program's own plugins, after DEVALLOC_PLUGIN_PATH (source caller).
  std::vector<std::filesystem::path> fallback_dirs;
  // --trust-plugin-path and [security] trust_paths: see check_plugin_file.
  std::vector<std::filesystem::path> trusted_paths;
  // How the program's user adds to trusted_paths, named where a plugin is
  // refused and where trusted paths are ignored: the CLI's
  // "--trust-plugin-path", Python's "trust_plugin_path=FOLDER". Empty when
  // the program has no such option: only the config's ways are named.
  std::string trust_path_option;
  // The identity the trust checks use; this process's when unset. Tests set
  // it to see what an elevated process would do.
  std::optional<ProcessCredentials> credentials;
};

class PluginLoader {
 public:
  explicit PluginLoader(PluginSearchOptions options = {});
  // extra_dirs are searched first, as the program's own (source caller).
  explicit PluginLoader(std::vector<std::filesystem::path> extra_dirs);

  // ../lib/devalloc/plugins next to the binary containing the loader: the
  // program as /proc/self/exe names it (never argv[0]), or the shared object
  // (the Python module) as the dynamic linker opened it. Empty when neither
  // can be found. Found once, when the program (or the shared object)
  // starts.
  static std::filesystem::path installed_plugin_dir();
  // "libdevalloc_" + name + ".so"
  static std::string file_name_for(const std::string& name);

  const std::vector<std::filesystem::path>& search_path() const {
    return search_path_;
  }
  const std::vector<PluginSearchDir>& search_dirs() const {
    return search_dirs_;
  }
  // What was ignored and why ("DEVALLOC_PLUGIN_PATH is ignored: ...").
  const std::vector<std::string>& notes() const { return notes_; }
  bool elevated() const { return credentials_.elevation().has_value(); }

  // A spec containing '/' or ending in ".so" is a path (made absolute);
  // anything else is a plugin name looked up on the search path.
  std::pair<std::filesystem::path, PluginError> resolve(
      const std::string& name_or_path) const;

  // resolve + check_plugin_file + PluginLibrary::open + Plugin::create
  // (with layers). trusted: [plugins.NAME] trust = true for this plugin.
  // Nothing throws: an allocation that fails is an open_failed error
  // (out_of_host_memory).
  std::pair<std::shared_ptr<Plugin>, PluginError> load(
      const std::string& name_or_path, const PluginOptions& options = {},
      const LayerSettings& layers = {}, bool trusted = false) const;

  // Every libdevalloc_*.so on the search path, each checked, then opened and
  // created with the settings given for its name (none by default); a file
  // refused by the checks is listed with the reason and never opened; a
  // later file of a name already seen, or of a name whose settings have
  // shadowed_by, is listed as shadowed and not opened.
  std::vector<PluginCandidate> discover(
      const std::map<std::string, PluginLoadSettings, std::less<>>& settings = {}) const;

 private:
  std::pair<std::shared_ptr<Plugin>, PluginError> load_or_throw(
      const std::string& name_or_path, const PluginOptions& options, const LayerSettings& layers,
      bool trusted) const;
  std::pair<std::shared_ptr<Plugin>, PluginError> load_file(
      const std::filesystem::path& path, const PluginOptions& options,
      const LayerSettings& layers, bool trusted) const;

  std::string ignored_sources() const;  // notes_, each after "; "

  ProcessCredentials credentials_;
  std::vector<std::filesystem::path> trusted_paths_;
  std::string trust_path_option_;
  std::vector<PluginSearchDir> search_dirs_;
  std::vector<std::filesystem::path> search_path_;
  std::vector<std::string> notes_;
};

}  // namespace devalloc
