// A whole file mapped read-only into memory.
//
// Held through shared_ptr: whoever reads the bytes (a copy the plugin has not
// yet released, a SafetensorsFile) keeps the mapping alive, and the last
// owner unmaps it.
#pragma once

#include <devalloc/status.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <utility>

namespace devalloc {

class MappedFile {
 public:
  // Opens `path` with open_regular_file (devalloc/regular_file.hpp: a FIFO or
  // device is refused at once, never waited on) and maps it with PROT_READ
  // and MAP_PRIVATE. An empty file is not mapped: bytes() is then empty with a
  // null data(). Errors (invalid_argument) read "<path>: cannot open: <errno
  // text>", "<path>: not a regular file (a FIFO)", "<path>: cannot map 123
  // bytes: <errno text>".
  //
  // The mapping reflects the file: if another process truncates it while it is
  // mapped, reading the lost pages raises SIGBUS. devalloc reads the data of
  // a load through copy_to() (and its verify pass likewise), which turns that
  // SIGBUS into an error; a direct read of bytes() is not guarded. devalloc
  // never writes to the files it maps; writers replace files by rename
  // (write_safetensors does), which leaves an existing mapping intact.
  static Result<std::shared_ptr<const MappedFile>> open(
      const std::filesystem::path& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::byte* data() const { return data_; }
  // The open, read-only descriptor the mapping was made from (kept open for
  // pread by the load pipeline); -1 for an empty file.
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<size_t>(size_)}; }

  // memcpy of bytes [offset, offset + nbytes) to dst (a range not inside
  // size() is an invalid_argument error, nothing copied); a SIGBUS from a page the file lost to a truncation since it was
  // mapped becomes an invalid_argument error ("<path>: the page at offset N
  // could not be read (SIGBUS): the file was truncated after it was opened,
  // while it was being read") instead of ending the process. The first call
  // installs devalloc's SIGBUS handler, which passes every other SIGBUS on to
  // the handler it replaced (or the default action): see loading.md.
  Status copy_to(uint64_t offset, uint64_t nbytes, void* dst) const;

 private:
  MappedFile(std::filesystem::path path, const std::byte* data, uint64_t size,
             int fd)
      : path_(std::move(path)), data_(data), size_(size), fd_(fd) {}

  std::filesystem::path path_;
  const std::byte* data_;
  uint64_t size_;
  int fd_;
};

}  // namespace devalloc
