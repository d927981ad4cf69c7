// Replacing a file so that readers never see it half written.
#pragma once

#include <devalloc/status.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace devalloc::detail {

// A file written to "<path>.tmp-<pid>-<n>" in the same folder, then flushed
// to disk and renamed over `path` by commit(). Until then `path` is
// untouched; a file destroyed without commit() (an error, an exception) is
// removed. Errors name the file asked for and the errno text. Something at
// `path` that is not a regular file (a device node, a FIFO, a folder) is
// refused by open(), never replaced.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path) : path_(std::move(path)) {}
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  Status open();
  // Appends; after open().
  Status write(std::span<const std::byte> bytes);
  // Flushes, closes and renames into place; after open().
  Status commit();

 private:
  Status failed(const char* what, int error) const;

  std::filesystem::path path_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool created_ = false;
  uint64_t written_ = 0;
};

// An AtomicFile holding the concatenation of `parts`.
Status write_file_atomically(const std::filesystem::path& path,
                             std::span<const std::span<const std::byte>> parts);

}  // namespace devalloc::detail
