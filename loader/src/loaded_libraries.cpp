#include "loaded_libraries.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace devalloc::detail {
namespace {

struct Identity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  bool operator==(const Identity&) const = default;
};

Identity identity_of(const RegularFile& file) {
  return {file.device(), file.inode(), file.size()};
}

// One entry per plugin path ever loaded: a few in a process. Kept after the
// library is closed, since the dynamic linker may keep it loaded
// (RTLD_NODELETE, a unique symbol, another holder).
std::mutex g_mutex;
std::map<std::string, Identity>& loaded() {
  static auto* paths = new std::map<std::string, Identity>();  // outlives static destructors
  return *paths;
}

// Whether the dynamic linker holds an object under this name now.
bool still_loaded(const std::filesystem::path& path) {
  void* handle = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  ::dlclose(handle);
  return true;
}

}  // namespace

std::optional<std::string> replaced_while_loaded(const std::filesystem::path& path,
                                                 const RegularFile& file) {
  std::optional<Identity> before;
  {
    const std::lock_guard lock(g_mutex);
    auto it = loaded().find(path.string());
    if (it != loaded().end()) before = it->second;
  }
  if (!before || *before == identity_of(file) || !still_loaded(path)) return std::nullopt;
  return "the file was replaced on disk (device " + std::to_string(file.device()) + ", inode " +
         std::to_string(file.inode()) + ", " + std::to_string(file.size()) +
         " bytes; loaded: inode " + std::to_string(before->inode) + ", " +
         std::to_string(before->size) +
         " bytes) while its earlier version is still loaded in this process, and the "
         "dynamic linker would hand out that earlier version under this name: release "
         "every runtime, program and export that uses it (or restart) to load the new file";
}

void remember_loaded(const std::filesystem::path& path, const RegularFile& file) noexcept {
  try {
    const std::lock_guard lock(g_mutex);
    loaded()[path.string()] = identity_of(file);
  } catch (...) {
    // Out of memory: this path goes unchecked, as before the loader checked.
  }
}

}  // namespace devalloc::detail
