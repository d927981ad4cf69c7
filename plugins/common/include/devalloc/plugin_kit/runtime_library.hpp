// A vendor runtime opened at run time, so that a plugin has no link-time
// dependency on it and loads where it is missing. Each entry point is looked
// up by the symbol the library exports (versioned names such as
// cuMemAlloc_v2 spelled out: dlsym sees no header macros).
#pragma once

#include <string>
#include <vector>

namespace devalloc::plugin {

class RuntimeLibrary {
 public:
  // dlopen(path, RTLD_NOW | RTLD_LOCAL | extra_flags). `what` names the
  // runtime in messages ("the CUDA driver"). Throws Failure
  // (RUNTIME_UNAVAILABLE) with the dlerror text.
  RuntimeLibrary(const std::string& path, const char* what, int extra_flags = 0);
  // The first of `paths` (not empty) that dlopen opens, tried in order: for
  // a runtime whose soname changes with its major release. When none
  // opens, the Failure lists every path tried with its dlerror text.
  RuntimeLibrary(const std::vector<std::string>& paths, const char* what, int extra_flags = 0);
  ~RuntimeLibrary();
  RuntimeLibrary(const RuntimeLibrary&) = delete;
  RuntimeLibrary& operator=(const RuntimeLibrary&) = delete;

  const std::string& path() const { return path_; }

  // The entry point `name`; throws Failure(RUNTIME_UNAVAILABLE) naming the
  // library and the symbol when it is missing.
  void* symbol(const char* name) const;
  template <class Fn>
  void bind(Fn& entry_point, const char* name) const {
    entry_point = reinterpret_cast<Fn>(symbol(name));
  }

 private:
  std::string path_;
  std::string what_;
  void* handle_ = nullptr;
};

// The shared objects of the process now, by path (dl_iterate_phdr).
std::vector<std::string> loaded_objects();

// Keeps every shared object loaded since `before` (loaded_objects() taken
// earlier) loaded for the rest of the process: for the drivers a vendor
// loader opens on its own (a Vulkan ICD at vkCreateInstance) and closes
// again when its instance goes. A driver that keeps memory or threads of
// its own after that (Mesa's lavapipe keeps a little per device, reachable
// from its globals) must not be unmapped under them. Allocates; never
// throws (a failure leaves the objects as they were).
void keep_loaded_since(const std::vector<std::string>& before) noexcept;

}  // namespace devalloc::plugin

// For a table of entry points written as an X-macro list X(name):
//   struct Hip { DEVALLOC_KIT_ENTRY_POINTS(DEVALLOC_KIT_DECLARE_ENTRY_POINT) };
// declares `decltype(&::name) name` for each, and
//   LIST(DEVALLOC_KIT_BIND_ENTRY_POINT)  (with a RuntimeLibrary `library` in
// scope) looks each one up.
#define DEVALLOC_KIT_DECLARE_ENTRY_POINT(name) decltype(&::name) name = nullptr;
#define DEVALLOC_KIT_BIND_ENTRY_POINT(name) library.bind(name, #name);
