// Replacing a file so that readers never see it half written.
#pragma once

#include <devalloc/status.hpp>

#include <cstddef>
#include <filesystem>
#include <span>

namespace devalloc::detail {

// Writes the concatenation of `parts` to "<path>.tmp-<pid>-<n>" in the same
// folder, flushes it to disk, and renames it over `path`. On failure the
// temporary file is removed and `path` is untouched; the message names the
// file and the errno text. Something at `path` that is not a regular file
// (a device node, a FIFO, a folder) is refused, never replaced.
Status write_file_atomically(const std::filesystem::path& path,
                             std::span<const std::span<const std::byte>> parts);

}  // namespace devalloc::detail
