#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>

#include <dlfcn.h>

namespace devalloc::plugin {

RuntimeLibrary::RuntimeLibrary(const std::string& path, const char* what, int extra_flags)
    : path_(path), what_(what) {
  handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | extra_flags);
  if (handle_ == nullptr) {
    const char* reason = ::dlerror();
    throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                  "cannot open " + what_ + " \"" + path +
                      "\": " + (reason ? reason : "unknown reason")};
  }
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
