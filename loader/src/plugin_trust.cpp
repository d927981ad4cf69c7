#include <devalloc/plugin_trust.hpp>

#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <system_error>
#include <utility>
#include <vector>

namespace devalloc {

namespace fs = std::filesystem;

namespace {

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

bool is_within(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

// The reason `what` (the plugin file or a folder on its path) lets someone
// other than root and the effective user replace the plugin, or nothing.
std::optional<std::string> unsafe_owner_or_mode(
    const fs::path& what, const struct stat& st, bool is_folder,
    const ProcessCredentials& credentials) {
  const std::string noun = (is_folder ? "folder " : "file ") + path_for_message(what.string());
  if (st.st_uid != 0 && st.st_uid != credentials.effective_uid) {
    return noun + " is owned by uid " + std::to_string(st.st_uid) +
           ", neither root nor the effective user (uid " +
           std::to_string(credentials.effective_uid) + ")";
  }
  const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (!others_write) return std::nullopt;
  // Sticky and root-owned (as /tmp): others may add entries, but not rename
  // or remove ours.
  if (is_folder && (st.st_mode & S_ISVTX) != 0 && st.st_uid == 0) {
    return std::nullopt;
  }
  return noun + " is " +
         ((st.st_mode & S_IWOTH) != 0 ? "world-writable" : "group-writable") +
         " (mode " + octal_mode(st.st_mode) + ")";
}

// Splits a path or a link's target into its names, in front of `todo`.
void prepend_names(const fs::path& path, std::deque<fs::path>* todo) {
  std::vector<fs::path> names;
  for (const fs::path& name : path.relative_path()) {
    if (!name.empty()) names.push_back(name);
  }
  todo->insert(todo->begin(), names.begin(), names.end());
}

// Why someone other than root and the effective user could change what
// `path` (absolute) leads to, walking it as the kernel resolves it: every
// folder entered, "/" first, along the path as given and along each link's
// target; every symbolic link met, by its owner (a link's mode means
// nothing, but its owner may point it elsewhere, and a sticky folder lets
// anyone plant one); not the file at the end, which the caller checks on
// its descriptor. Nothing when all is safe; *file is then where it leads.
std::optional<std::string> unsafe_on_the_way(const fs::path& path,
                                             const ProcessCredentials& credentials,
                                             fs::path* file) {
  constexpr int kMaxLinks = 40;  // the kernel's own bound (ELOOP)
  const auto cannot_check = [](const fs::path& what, int error) {
    return path_for_message(what.string()) + " cannot be checked: " + std::strerror(error);
  };
  fs::path current = path.root_path();
  struct stat st {};
  if (::lstat(current.c_str(), &st) != 0) return "folder " + cannot_check(current, errno);
  if (auto why = unsafe_owner_or_mode(current, st, true, credentials)) return why;
  std::deque<fs::path> todo;
  prepend_names(path, &todo);
  int links = 0;
  while (!todo.empty()) {
    const fs::path name = std::move(todo.front());
    todo.pop_front();
    if (name == ".") continue;
    if (name == "..") {
      current = current.parent_path();  // checked on the way down
      continue;
    }
    const fs::path next = current / name;
    if (::lstat(next.c_str(), &st) != 0) return cannot_check(next, errno);
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(next, ec);
      if (ec) return cannot_check(next, ec.value());
      if (st.st_uid != 0 && st.st_uid != credentials.effective_uid) {
        return "symbolic link " + path_for_message(next.string()) + " (to " +
               path_for_message(target.string()) + ") is owned by uid " +
               std::to_string(st.st_uid) + ", neither root nor the effective user (uid " +
               std::to_string(credentials.effective_uid) + ")";
      }
      if (++links > kMaxLinks) {
        return path_for_message(path.string()) + " passes through more than " +
               std::to_string(kMaxLinks) + " symbolic links";
      }
      if (target.is_absolute()) current = target.root_path();
      prepend_names(target, &todo);
      continue;
    }
    if (todo.empty()) {
      *file = next;
      return std::nullopt;
    }
    if (!S_ISDIR(st.st_mode)) {
      return "folder " + path_for_message(next.string()) + " is not a folder";
    }
    if (auto why = unsafe_owner_or_mode(next, st, true, credentials)) return why;
    current = next;
  }
  *file = current;
  return std::nullopt;
}

}  // namespace

ProcessCredentials ProcessCredentials::current() {
  ProcessCredentials c;
  c.real_uid = getuid();
  c.effective_uid = geteuid();
  c.real_gid = getgid();
  c.effective_gid = getegid();
  c.at_secure = getauxval(AT_SECURE) != 0;
  return c;
}

std::optional<std::string> ProcessCredentials::elevation() const {
  if (effective_uid != real_uid) {
    return "effective uid " + std::to_string(effective_uid) +
           " differs from real uid " + std::to_string(real_uid);
  }
  if (effective_gid != real_gid) {
    return "effective gid " + std::to_string(effective_gid) +
           " differs from real gid " + std::to_string(real_gid);
  }
  if (at_secure) return std::string("the kernel set AT_SECURE");
  return std::nullopt;
}

const char* to_string(PluginPathSource source) {
  switch (source) {
    case PluginPathSource::command_line: return "--plugin-path";
    case PluginPathSource::config: return "config";
    case PluginPathSource::environment: return "DEVALLOC_PLUGIN_PATH";
    case PluginPathSource::installed: return "installed";
    case PluginPathSource::caller: return "caller";
  }
  return "unknown";
}

PluginFileCheck check_plugin_file(const fs::path& path, bool file_trusted,
                                  const std::vector<fs::path>& trusted_paths,
                                  std::string_view trust_path_option,
                                  const ProcessCredentials& credentials) {
  PluginFileCheck check;
  std::error_code ec;
  // The file dlopen will open, every symbolic link resolved: the checks
  // below are about it and the folders that really lead to it.
  const fs::path resolved = fs::canonical(path, ec);
  if (ec) {
    check.missing = true;
    check.refusal = "no such file";
    return check;
  }
  // Opened without blocking and checked on the descriptor: a FIFO or a
  // device named like a plugin is refused here, never handed to dlopen.
  Result<RegularFile> file = open_regular_file(resolved);
  if (!file.ok()) {
    check.refusal = "refused: " + file.status().message();
    return check;
  }
  struct stat st{};
  st.st_uid = file->owner();
  st.st_mode = file->mode();

  const bool elevated = credentials.elevation().has_value();
  bool trusted = file_trusted && !elevated;
  for (const auto& root : trusted_paths) {
    if (elevated || trusted) break;
    // A NUL would cut the path for every call that resolves it: "DIR\0/x"
    // would trust all of DIR. Such a path names no folder.
    if (root.native().find('\0') != std::string::npos) continue;
    const fs::path canonical_root = fs::weakly_canonical(root, ec);
    trusted = !ec && is_within(resolved, canonical_root);
  }
  if (!trusted) {
    const auto refuse = [&](std::string why) {
      check.refusal =
          "refused: " + why +
          "; only root and the effective user may be able to change a "
          "plugin or a folder above it (docs/security.md" +
          (elevated ? "; trust settings are ignored while running with "
                      "elevated privileges: " + *credentials.elevation() + ")"
                    : "; to trust it anyway: " +
                          (trust_path_option.empty()
                               ? std::string()
                               : std::string(trust_path_option) + ", ") +
                          "[security] trust_paths or [plugins.NAME] trust = true)");
      return std::move(check);
    };
    if (auto why = unsafe_owner_or_mode(resolved, st, false, credentials)) {
      return refuse(*why);
    }
    // The path as given, not only where it leads: a link planted in a
    // folder that others may write would choose the file.
    fs::path walked;
    if (auto why = unsafe_on_the_way(fs::absolute(path, ec), credentials, &walked)) {
      return refuse(*why);
    }
    if (walked != resolved) {
      return refuse(path_for_message(path.string()) + " led to " +
                    path_for_message(resolved.string()) + ", then to " +
                    path_for_message(walked.string()) + ": changed while it was checked");
    }
  }
  check.resolved = resolved;
  check.file = std::move(*file);
  return check;
}

}  // namespace devalloc
