// Whether a plugin file may be opened: the trust model of docs/security.md.
//
// Opening a plugin runs its code (constructors run inside dlopen), so a file
// is checked before it is opened: it must be a regular file, and nobody but
// root and the effective user may be able to replace it or any folder on the
// way to it. Callers may declare paths trusted (then only the regular-file
// check applies), except when the process runs with elevated privileges:
// then nothing the user supplies counts, neither paths nor trust.
#pragma once

#include <devalloc/regular_file.hpp>

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc {

// The identity the process runs with, as the trust checks see it.
struct ProcessCredentials {
  uid_t real_uid = 0;
  uid_t effective_uid = 0;
  gid_t real_gid = 0;
  gid_t effective_gid = 0;
  bool at_secure = false;  // getauxval(AT_SECURE): setuid, setgid, capabilities

  // This process: getuid, geteuid, getgid, getegid, getauxval(AT_SECURE).
  static ProcessCredentials current();

  // Why the process counts as elevated ("effective uid 0 differs from real
  // uid 1000"), or nothing when it does not.
  std::optional<std::string> elevation() const;
};

// Where a folder of the search path or a plugin file path came from.
enum class PluginPathSource {
  command_line,  // --plugin-path
  config,        // the runtime config's plugin_path or [plugins.X] library
  environment,   // DEVALLOC_PLUGIN_PATH
  installed,     // ../lib/devalloc/plugins next to the loader's binary
  caller,        // given by a program through the C++ API
};
const char* to_string(PluginPathSource source);

// The checks of docs/security.md, on the file that would be opened:
//  - the path resolves (symbolic links followed) to a regular file;
//  - unless trusted: the file and every folder from it up to "/" are owned
//    by root or by the effective user, and are neither group- nor
//    world-writable; a folder writable by others is accepted only when it is
//    root-owned and has the sticky bit (as /tmp), since then nobody else can
//    rename or remove what the effective user put in it.
// Returns the resolved path, or the reason for refusal naming the offending
// file or folder with its owner or mode.
struct PluginFileCheck {
  std::filesystem::path resolved;  // the file to open; set when accepted
  RegularFile file;                // resolved, open; the descriptor checked
  std::string refusal;             // set when refused
  bool missing = false;            // refused because nothing is there

  bool ok() const { return refusal.empty(); }
};
// file_trusted ([plugins.X] trust = true) and trusted_paths (a file at or
// below one of them, after resolving symbolic links, is trusted:
// --trust-plugin-path, [security] trust_paths) skip the owner and permission
// checks, but count for nothing while credentials are elevated.
// A refusal ends with the ways to trust the file anyway: trust_path_option
// first when not empty (how the calling program's user adds a trusted path:
// the CLI's "--trust-plugin-path"), then the config's.
PluginFileCheck check_plugin_file(
    const std::filesystem::path& path, bool file_trusted,
    const std::vector<std::filesystem::path>& trusted_paths,
    std::string_view trust_path_option, const ProcessCredentials& credentials);

}  // namespace devalloc
