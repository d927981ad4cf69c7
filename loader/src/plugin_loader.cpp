#include <devalloc/plugin_loader.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <system_error>

namespace devalloc {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFilePrefix = "libdevalloc_";
constexpr const char* kFileSuffix = ".so";

bool looks_like_path(const std::string& spec) {
  return spec.find('/') != std::string::npos ||
         (spec.size() > 3 && spec.ends_with(kFileSuffix)) ||
         spec.find(".so.") != std::string::npos;
}

std::string join(const std::vector<fs::path>& dirs) {
  std::string out;
  for (const auto& d : dirs) {
    if (!out.empty()) out += ", ";
    out += d.string();
  }
  return out.empty() ? "(empty search path)" : out;
}

}  // namespace

bool is_valid_plugin_name(std::string_view name) {
  return !name.empty() &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '_' || c == '-';
         });
}

PluginLoader::PluginLoader(std::vector<fs::path> extra_dirs)
    : search_path_(default_search_path(extra_dirs)) {}

std::string PluginLoader::file_name_for(const std::string& name) {
  return kFilePrefix + name + kFileSuffix;
}

fs::path PluginLoader::installed_plugin_dir() {
  std::error_code ec;
  fs::path self = boost::dll::this_line_location(ec);
  if (ec || self.empty()) return {};
  if (self.is_relative()) {
    // The loader is in the main program, located as it was invoked
    // ("./bin/devalloc"): ask the kernel, which does not depend on the
    // current directory.
    std::error_code program_ec;
    fs::path program = boost::dll::program_location(program_ec);
    self = !program_ec && program.filename() == self.filename()
               ? program
               : fs::absolute(self, ec);
  }
  return (self.parent_path() / DEVALLOC_PLUGIN_DIR_FROM_BIN).lexically_normal();
}

std::vector<fs::path> PluginLoader::default_search_path(
    const std::vector<fs::path>& extra_dirs) {
  std::vector<fs::path> dirs;
  for (const auto& d : extra_dirs) {
    dirs.push_back(fs::absolute(d).lexically_normal());
  }
  // secure_getenv: a setuid program must not load plugins named by its user.
  if (const char* env = secure_getenv("DEVALLOC_PLUGIN_PATH")) {
    std::string value(env);
    size_t start = 0;
    while (start <= value.size()) {
      size_t end = value.find(':', start);
      if (end == std::string::npos) end = value.size();
      const std::string entry = value.substr(start, end - start);
      // An empty entry would mean the current directory; never implied.
      if (!entry.empty()) dirs.push_back(fs::absolute(entry).lexically_normal());
      start = end + 1;
    }
  }
  if (fs::path installed = installed_plugin_dir(); !installed.empty()) {
    dirs.push_back(std::move(installed));
  }
  return dirs;
}

std::pair<fs::path, PluginError> PluginLoader::resolve(
    const std::string& spec) const {
  std::error_code ec;
  if (looks_like_path(spec)) {
    fs::path path = fs::absolute(spec, ec).lexically_normal();
    if (ec || !fs::exists(path, ec)) {
      return {{},
              {PluginOutcome::not_found,
               Status(StatusCode::runtime_unavailable,
                      "plugin " + path.string() + ": no such file")}};
    }
    return {path, {PluginOutcome::loaded, Status()}};
  }
  if (!is_valid_plugin_name(spec)) {
    return {{},
            {PluginOutcome::not_found,
             Status(StatusCode::invalid_argument,
                    "\"" + spec +
                        "\" is neither a plugin name (letters, digits, _ "
                        "and -) nor a path to a .so file")}};
  }
  const std::string file = file_name_for(spec);
  for (const auto& dir : search_path_) {
    fs::path candidate = dir / file;
    if (fs::is_regular_file(candidate, ec)) return {candidate, {}};
  }
  return {{},
          {PluginOutcome::not_found,
           Status(StatusCode::runtime_unavailable,
                  "plugin \"" + spec + "\" not found: no " + file + " in " +
                      join(search_path_))}};
}

std::pair<std::shared_ptr<Plugin>, PluginError> PluginLoader::load(
    const std::string& spec, const PluginOptions& options,
    const LayerSettings& layers) const {
  auto [path, resolve_error] = resolve(spec);
  if (path.empty()) return {nullptr, resolve_error};
  auto [library, open_error] = PluginLibrary::open(path);
  if (!library) return {nullptr, open_error};
  return Plugin::create(std::move(library), options, layers);
}

std::vector<PluginCandidate> PluginLoader::discover() const {
  std::vector<PluginCandidate> out;
  std::set<std::string> seen;
  std::set<fs::path> visited_dirs;
  for (const auto& dir : search_path_) {
    std::error_code ec;
    if (!visited_dirs.insert(dir).second || !fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string fname = entry.path().filename().string();
      if (fname.starts_with(kFilePrefix) && fname.ends_with(kFileSuffix) &&
          fname.size() > std::string(kFilePrefix).size() + 3) {
        files.push_back(entry.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      PluginCandidate c;
      const std::string fname = path.filename().string();
      c.name = fname.substr(std::string(kFilePrefix).size(),
                            fname.size() - std::string(kFilePrefix).size() -
                                std::string(kFileSuffix).size());
      c.path = path;
      if (!seen.insert(c.name).second) {
        c.outcome = PluginOutcome::shadowed;
        c.reason = "a plugin named \"" + c.name +
                   "\" was found earlier on the search path";
        out.push_back(std::move(c));
        continue;
      }
      auto [plugin, error] = load(path.string());
      c.outcome = error.outcome;
      c.reason = error.status.message();
      c.code = error.status.code();
      c.plugin = std::move(plugin);
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace devalloc
