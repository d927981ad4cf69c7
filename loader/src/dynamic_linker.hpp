// What the loader knows about the state of the dynamic linker.
#pragma once

#include <optional>
#include <string>

namespace devalloc::detail {

// Why no plugin can be opened any more in this process, or nothing: once a
// plugin's static initializer threw a C++ exception out of dlopen
// (PLUGIN-7), the dynamic linker's lock is held for ever by the thread that
// opened it, and any other thread's dlopen, dlsym, dladdr or dlclose would
// wait for it for ever. "the static initializer of plugin PATH threw a C++
// exception out of dlopen (PLUGIN-7), which left the dynamic linker locked:
// this process can open no other plugin and must be restarted". Set by
// PluginLibrary::open; the loader then calls into the dynamic linker no
// more (no dlopen, no dlclose; its installed folder was found at start).
std::optional<std::string> dynamic_linker_left_locked();

}  // namespace devalloc::detail
