#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>
#include <devalloc/plugin_loader.hpp>

#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <unistd.h>

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
    out += path_for_message(d.string());
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
    : PluginLoader([&] {
        PluginSearchOptions options;
        options.command_line_dirs = std::move(extra_dirs);
        return options;
      }()) {
  for (auto& d : search_dirs_) {
    if (d.source == PluginPathSource::command_line) {
      d.source = PluginPathSource::caller;
    }
  }
}

PluginLoader::PluginLoader(PluginSearchOptions options)
    : credentials_(options.credentials.value_or(ProcessCredentials::current())),
      trusted_paths_(std::move(options.trusted_paths)),
      trust_path_option_(std::move(options.trust_path_option)) {
  const std::optional<std::string> elevation = credentials_.elevation();
  auto add = [&](const fs::path& dir, PluginPathSource source) {
    // An empty name would be the current directory: never implied.
    std::error_code ec;
    const fs::path absolute = dir.empty() ? fs::path() : fs::absolute(dir, ec);
    if (absolute.empty() || ec) {
      notes_.push_back(std::string("an empty folder name from ") + to_string(source) +
                       " is skipped (the current directory is never searched implicitly)");
      return;
    }
    search_dirs_.push_back({absolute.lexically_normal(), source});
  };
  // Every source but the installed folder is the user's word; a process
  // with more rights than its user must not take it.
  auto user_source = [&](bool present, const std::string& what) {
    if (present && elevation) {
      notes_.push_back(what + " is ignored while running with elevated "
                              "privileges (" + *elevation + ")");
    }
    return present && !elevation;
  };
  if (user_source(!options.command_line_dirs.empty(), "--plugin-path")) {
    for (const auto& d : options.command_line_dirs) {
      add(d, PluginPathSource::command_line);
    }
  }
  if (user_source(!options.config_dirs.empty(), "the config's plugin_path")) {
    for (const auto& d : options.config_dirs) add(d, PluginPathSource::config);
  }
  // secure_getenv already hides the variable from a setuid program; the
  // explicit check also covers a process that gained rights otherwise.
  const char* env = secure_getenv("DEVALLOC_PLUGIN_PATH");
  if (env == nullptr && elevation && getenv("DEVALLOC_PLUGIN_PATH") != nullptr) {
    env = "";  // only to say that it was ignored
  }
  if (user_source(env != nullptr, "DEVALLOC_PLUGIN_PATH")) {
    std::string value(env);
    size_t start = 0;
    while (start <= value.size()) {
      size_t end = value.find(':', start);
      if (end == std::string::npos) end = value.size();
      const std::string entry = value.substr(start, end - start);
      // An empty entry would mean the current directory; never implied.
      if (!entry.empty()) add(entry, PluginPathSource::environment);
      start = end + 1;
    }
  }
  if (user_source(!options.fallback_dirs.empty(), "the program's own plugin path")) {
    for (const auto& d : options.fallback_dirs) add(d, PluginPathSource::caller);
  }
  if (!user_source(!trusted_paths_.empty(),
                   (trust_path_option_.empty() ? "" : trust_path_option_ + " / ") +
                       "[security] trust_paths")) {
    trusted_paths_.clear();
  }
  if (fs::path installed = installed_plugin_dir(); !installed.empty()) {
    std::error_code ec;
    if (fs::is_directory(installed, ec)) {
      add(installed, PluginPathSource::installed);
    } else {
      // A program of its own that links devalloc's libraries, or the Python
      // module: nothing of devalloc's is next to it. Said wherever a plugin
      // is not found, with what to do.
      notes_.push_back("there is no installed plugin folder " +
                       path_for_message(installed.string()) +
                       " next to this program; a program outside devalloc's install "
                       "prefix finds its plugins through the config's plugin_path or "
                       "DEVALLOC_PLUGIN_PATH (" DEVALLOC_PLUGIN_DIR_HINT ")");
    }
  }
  for (const auto& d : search_dirs_) search_path_.push_back(d.dir);
}

std::string PluginLoader::file_name_for(const std::string& name) {
  return kFilePrefix + name + kFileSuffix;
}

namespace {

fs::path find_installed_plugin_dir() {
  // The object that contains this code: the main program (devalloc, a
  // program linking the static loader) or a shared object (the Python
  // module). Any address of this file's code or data names it.
  static const char anchor = 0;
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(&anchor, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 ||
      map == nullptr) {
    return {};
  }
  fs::path self;
  if (map->l_name == nullptr || map->l_name[0] == '\0') {
    // The main program. dladdr would answer argv[0], which whoever starts
    // the program chooses (a symbolic link, exec -a): ask the kernel for the
    // file it runs. A setuid program must not let its caller pick the
    // folder it trusts. Without /proc there is no installed folder.
    char buffer[PATH_MAX + 1];
    const ssize_t n = ::readlink("/proc/self/exe", buffer, PATH_MAX);
    if (n <= 0 || n >= PATH_MAX) return {};
    self.assign(buffer, buffer + n);
  } else {
    // A shared object: the path the dynamic linker opened it by (dladdr's
    // dli_fname, which is the link map's l_name).
    if (info.dli_fname == nullptr) return {};
    self = info.dli_fname;
  }
  std::error_code ec;
  if (self.is_relative()) self = fs::absolute(self, ec);
  if (ec || self.empty()) return {};
  return (self.parent_path() / DEVALLOC_PLUGIN_DIR_FROM_BIN).lexically_normal();
}

// Found once, when the program (or the shared object containing the loader)
// starts: the folder cannot move while it runs, and each loader made later
// asks for it.
const fs::path& installed_plugin_dir_once() noexcept {
  static const fs::path dir = []() noexcept {
    try {
      return find_installed_plugin_dir();
    } catch (...) {
      return fs::path();
    }
  }();
  return dir;
}

[[maybe_unused]] const bool g_installed_plugin_dir_found_at_start =
    (installed_plugin_dir_once(), true);

}  // namespace

fs::path PluginLoader::installed_plugin_dir() { return installed_plugin_dir_once(); }

std::string PluginLoader::ignored_sources() const {
  std::string out;
  for (const auto& note : notes_) out += "; " + note;
  return out;
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
                      "plugin " + path_for_message(path.string()) + ": no such file")}};
    }
    return {path, {PluginOutcome::loaded, Status()}};
  }
  if (!is_valid_plugin_name(spec)) {
    return {{},
            {PluginOutcome::not_found,
             Status(StatusCode::invalid_argument,
                    quote(spec) +
                        " is neither a plugin name (letters, digits, _ "
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
                      join(search_path_) + ignored_sources())}};
}

std::pair<std::shared_ptr<Plugin>, PluginError> PluginLoader::load(
    const std::string& spec, const PluginOptions& options,
    const LayerSettings& layers, bool trusted) const {
  // No exception leaves: one (an allocation that fails) is the load's error.
  std::pair<std::shared_ptr<Plugin>, PluginError> loaded;
  const Status s = detail::catch_as_status(
      [&] {
        loaded = load_or_throw(spec, options, layers, trusted);
        return Status();
      },
      [&](StatusCode code, std::string_view what) {
        return "plugin " + quote(spec) + ": " + detail::failure_text(code, what);
      });
  if (!s.ok()) return {nullptr, {PluginOutcome::open_failed, s}};
  return loaded;
}

std::pair<std::shared_ptr<Plugin>, PluginError> PluginLoader::load_or_throw(
    const std::string& spec, const PluginOptions& options,
    const LayerSettings& layers, bool trusted) const {
  auto [path, resolve_error] = resolve(spec);
  if (path.empty()) return {nullptr, resolve_error};
  if (looks_like_path(spec)) {
    if (auto elevation = credentials_.elevation()) {
      // An explicit path is the user's word too (a config's library, a
      // command line): only the installed folder is taken.
      std::error_code ec;
      const fs::path installed = fs::weakly_canonical(installed_plugin_dir(), ec);
      if (fs::weakly_canonical(path, ec).parent_path() != installed) {
        return {nullptr,
                {PluginOutcome::untrusted,
                 Status(StatusCode::unsupported,
                        "plugin " + path_for_message(path.string()) +
                            ": refused: an explicit plugin path is not taken "
                            "while running with elevated privileges (" +
                            *elevation + "); only the installed folder " +
                            path_for_message(installed.string()) + " is")}};
      }
    }
  }
  return load_file(path, options, layers, trusted);
}

std::pair<std::shared_ptr<Plugin>, PluginError> PluginLoader::load_file(
    const fs::path& path, const PluginOptions& options,
    const LayerSettings& layers, bool trusted) const {
  // Checked right before it is opened, on the file dlopen will map.
  const PluginFileCheck check =
      check_plugin_file(path, trusted, trusted_paths_, trust_path_option_, credentials_);
  if (!check.ok()) {
    return {nullptr,
            {check.missing ? PluginOutcome::not_found : PluginOutcome::untrusted,
             Status(check.missing ? StatusCode::runtime_unavailable
                                  : StatusCode::unsupported,
                    "plugin " + path_for_message(path.string()) + ": " + check.refusal)}};
  }
  auto [library, open_error] = PluginLibrary::open(check.resolved, check.file);
  if (!library) return {nullptr, open_error};
  return Plugin::create(std::move(library), options, layers);
}

std::vector<PluginCandidate> PluginLoader::discover(
    const std::map<std::string, PluginLoadSettings, std::less<>>& settings) const {
  static const PluginLoadSettings none;
  std::vector<PluginCandidate> out;
  std::set<std::string> seen;
  std::set<fs::path> visited_dirs;
  for (const auto& [dir, source] : search_dirs_) {
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
      c.source = source;
      const auto given = settings.find(c.name);
      const PluginLoadSettings& use = given != settings.end() ? given->second : none;
      if (!use.shadowed_by.empty()) {
        c.outcome = PluginOutcome::shadowed;
        c.reason = use.shadowed_by;
        out.push_back(std::move(c));
        continue;
      }
      if (!seen.insert(c.name).second) {
        c.outcome = PluginOutcome::shadowed;
        c.reason = "a plugin named " + quote(c.name) + " was found earlier on the search path";
        out.push_back(std::move(c));
        continue;
      }
      auto [plugin, error] = load_file(path, use.options, use.layers, use.trusted);
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
