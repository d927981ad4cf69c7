#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <new>

namespace devalloc::plugin {

RuntimeLibrary::RuntimeLibrary(const std::string& path, const char* what, int extra_flags)
    : RuntimeLibrary(std::vector<std::string>{path}, what, extra_flags) {}

RuntimeLibrary::RuntimeLibrary(const std::vector<std::string>& paths, const char* what,
                               int extra_flags)
    : what_(what) {
  std::string tried;
  for (const std::string& path : paths) {
    handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | extra_flags);
    if (handle_ != nullptr) {
      path_ = path;
      return;
    }
    const char* reason = ::dlerror();
    if (!tried.empty()) tried += "; ";
    tried += "\"" + path + "\": " + (reason ? reason : "unknown reason");
  }
  throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                "cannot open " + what_ + (paths.size() == 1 ? " " : ", tried ") + tried};
}

RuntimeLibrary::~RuntimeLibrary() { ::dlclose(handle_); }

void* RuntimeLibrary::symbol(const char* name) const {
  ::dlerror();
  void* symbol = ::dlsym(handle_, name);
  if (symbol != nullptr) return symbol;
  const char* reason = ::dlerror();
  std::string message = what_ + " \"" + path_ + "\" has no entry point " + name +
                        " (runtime too old for this plugin?)";
  if (reason != nullptr) message += std::string(": ") + reason;
  throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE, message};
}

std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(out)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &names);
  return names;
}

void keep_loaded_since(const std::vector<std::string>& before) noexcept {
  try {
    for (const std::string& name : loaded_objects()) {
      if (std::find(before.begin(), before.end(), name) != before.end()) continue;
      // RTLD_NOLOAD: only what is loaded already; RTLD_NODELETE marks it
      // never to be unloaded. The reference this takes is never dropped.
      (void)::dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    }
  } catch (const std::bad_alloc&) {
    // The objects stay as they were: unloaded with their instance.
  }
}

}  // namespace devalloc::plugin
