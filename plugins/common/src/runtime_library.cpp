#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>

#include <dlfcn.h>

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

}  // namespace devalloc::plugin
