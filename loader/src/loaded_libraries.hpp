// Which file each plugin path was loaded from, process-wide.
//
// The dynamic linker finds an object already loaded under the same name and
// hands that out again: a plugin file replaced on disk (a new file renamed
// over it) while its old version is still loaded (a runtime, program or
// export still holds it) would be "opened" as the old code, with every check
// of the loader done on the new file. The loader remembers the file
// (device, inode, size) each path was loaded from and refuses to open a path
// that is still loaded from another file.
#pragma once

#include <devalloc/regular_file.hpp>

#include <filesystem>
#include <optional>
#include <string>

namespace devalloc::detail {

// Why `file`, just opened at `path`, would not be what the dynamic linker
// loads for `path`: it still holds a library loaded from another file under
// that name. nullopt when it would (nothing loaded under that name, or
// loaded from this very file, or loaded by someone else than this loader).
std::optional<std::string> replaced_while_loaded(const std::filesystem::path& path,
                                                 const RegularFile& file);

// Records that the library at `path` was loaded from `file` (out of
// memory: not recorded, and that path goes unchecked).
void remember_loaded(const std::filesystem::path& path, const RegularFile& file) noexcept;

}  // namespace devalloc::detail
