#include <devalloc/core/safetensors.hpp>
#include <devalloc/no_exceptions.hpp>

namespace devalloc {

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsCache::open(
    const std::filesystem::path& path, const std::filesystem::path& beneath) {
  // Opening under the lock keeps one mapping per file; headers are small
  // next to the data, so contention costs little.
  return detail::catch_as_status(
      [&]() -> Result<std::shared_ptr<const SafetensorsFile>> {
        std::lock_guard lock(mutex_);
        auto it = files_.find(path);
        // An entry serves while its file is the version it opened (one
        // fstat): a file modified in place since shows new bytes under the
        // entry's old header, and is opened again.
        if (it != files_.end() && it->second->mapping()->check_unchanged("").ok()) {
          return it->second;
        }
        Result<std::shared_ptr<const SafetensorsFile>> opened =
            SafetensorsFile::open(path, beneath);
        if (!opened.ok()) {
          // Not remembered: the next open tries again (a file restored
          // meanwhile opens).
          if (it != files_.end()) files_.erase(it);
          return opened.status();
        }
        if (it != files_.end()) {
          it->second = *opened;
        } else {
          files_.emplace(path, *opened);
        }
        return opened;
      },
      detail::file_failure(path, "opening"));
}

}  // namespace devalloc
