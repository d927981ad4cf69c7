// A whole file mapped read-only into memory.
//
// Held through shared_ptr: whoever reads the bytes (a copy the plugin has not
// yet released, a SafetensorsFile) keeps the mapping alive, and the last
// owner unmaps it.
#pragma once

#include <devalloc/regular_file.hpp>  // FileVersion
#include <devalloc/status.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string_view>
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
  //
  // A file rewritten in place (the same inode: `cp` onto it, open("wb"),
  // pwrite) shows its new bytes through the mapping, under whatever was read
  // of it before (a header, offsets). open() records the file's version
  // (fstat of the descriptor, before a byte is read), and check_unchanged()
  // compares it with the file now.
  //
  // beneath not empty: `path` must lie inside the folder `beneath` (both
  // absolute and normal), and is opened with open_regular_file_beneath,
  // which refuses a symbolic link or ".." that leads out of it, a link
  // swapped in after any check of the path included ("<path>: refused: it
  // leads out of the folder <beneath> ..."). The mapping and every read are
  // of that descriptor; the path is never opened again.
  static Result<std::shared_ptr<const MappedFile>> open(
      const std::filesystem::path& path, const std::filesystem::path& beneath = {});

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::byte* data() const { return data_; }
  // The open, read-only descriptor the mapping was made from (kept open for
  // pread by the load pipeline, and for check_unchanged), an empty file's
  // too.
  int fd() const { return fd_; }
  // The file as fstat described it when it was opened, before any of its
  // bytes were read; size() is its size.
  const FileVersion& version() const { return version_; }

  // OK while the file is the version it was when opened: one fstat of the
  // kept descriptor, compared with version(). Otherwise an invalid_argument
  // error: "<path>: modified in place <when> (its size went from A to B
  // bytes, its modification time from T1 to T2): ... replace a file by
  // writing a new one and renaming it over the old one ...", `when` saying
  // when ("since it was opened", "while it was being loaded").
  //
  // Modified means another size or modification time, or another status
  // change time while the file has as many links as it had. A rename over
  // the file (the safe way to replace it) unlinks it, which moves its status
  // change time but changes nothing of its bytes: not a change. A chmod,
  // chown or rename of the file itself also moves that time, and is taken
  // for a change (a writer that set the modification time back looks the
  // same). The times have the kernel's granularity: a write within the same
  // clock tick as the open may leave them unchanged, and go unnoticed; and
  // the kernel sets them when a write call starts, so a write already under
  // way at the open, with none after it, goes unnoticed too (loading.md).
  Status check_unchanged(std::string_view when) const;
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
  MappedFile(std::filesystem::path path, const std::byte* data, const FileVersion& version,
             int fd)
      : path_(std::move(path)), data_(data), size_(version.size), fd_(fd), version_(version) {}

  std::filesystem::path path_;
  const std::byte* data_;
  uint64_t size_;
  int fd_;
  FileVersion version_;
};

}  // namespace devalloc
