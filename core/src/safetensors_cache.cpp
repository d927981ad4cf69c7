#include <devalloc/core/safetensors.hpp>
#include <devalloc/no_exceptions.hpp>

namespace devalloc {

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsCache::open(
    const std::filesystem::path& path) {
  // Opening under the lock keeps one mapping per file; headers are small
  // next to the data, so contention costs little.
  return detail::catch_as_status(
      [&]() -> Result<std::shared_ptr<const SafetensorsFile>> {
        std::lock_guard lock(mutex_);
        auto it = files_.find(path);
        if (it == files_.end()) it = files_.emplace(path, SafetensorsFile::open(path)).first;
        return it->second;
      },
      detail::file_failure(path, "opening"));
}

}  // namespace devalloc
