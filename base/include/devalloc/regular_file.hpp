// Opening a file that devalloc was told to read (a safetensors file, a plan,
// a config, a plugin library) without trusting what the path names.
//
// The path is opened with O_NONBLOCK, so a FIFO or a device answers at once
// instead of blocking in open(), and then checked with fstat on the open
// descriptor (not the path, which could be swapped in between): anything but
// a regular file is refused before a byte is read.
#pragma once

#include <devalloc/status.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace devalloc {

// What fstat says of an open file: which file it is (device, inode) and
// which version of it (size, modification and status change times, link
// count). Recorded when a file is opened (RegularFile::version()) and
// compared later to tell a file modified in place (same inode, new bytes)
// from the one opened (MappedFile::check_unchanged).
struct FileVersion {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  uint64_t links = 0;
  int64_t modified_seconds = 0;  // st_mtim
  int64_t modified_nanoseconds = 0;
  int64_t changed_seconds = 0;  // st_ctim
  int64_t changed_nanoseconds = 0;
};

// The version of the file open as `fd` now, in *version: 0, or the errno
// of a failed fstat.
int read_file_version(int fd, FileVersion* version) noexcept;

namespace detail {
struct RegularFileAccess;  // regular_file.cpp: fills a RegularFile in
}  // namespace detail

// An open, read-only descriptor of a regular file. Closes it when destroyed.
class RegularFile {
 public:
  RegularFile() = default;
  ~RegularFile();
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  // Hands the descriptor over (the caller closes it); fd() is -1 after.
  int release() noexcept { return std::exchange(fd_, -1); }
  // From fstat at open, before a byte was read.
  const FileVersion& version() const { return version_; }
  uint64_t size() const { return version_.size; }
  uint64_t device() const { return version_.device; }
  uint64_t inode() const { return version_.inode; }
  uint32_t mode() const { return mode_; }
  uint32_t owner() const { return owner_; }

 private:
  friend struct detail::RegularFileAccess;
  int fd_ = -1;
  FileVersion version_;
  uint32_t mode_ = 0;
  uint32_t owner_ = 0;
};

// Opens `path` with O_RDONLY | O_NONBLOCK | O_CLOEXEC and refuses anything
// that fstat does not call a regular file. Errors read "<path>: cannot
// open: <errno text>" or "<path>: not a regular file (a FIFO)" and are
// invalid_argument, except out_of_host_memory when the process or system
// ran out of descriptors or memory (EMFILE, ENFILE, ENOMEM): a resource
// limit, not a bad file.
Result<RegularFile> open_regular_file(const std::filesystem::path& path);

// open_regular_file for `relative` (a relative path) inside `folder`, never
// leaving it: every part of `relative` is resolved beneath `folder`, and a
// symbolic link or ".." that leads out of it (an absolute link, or one that
// climbs above it) refuses the file, whatever was checked of the path
// before: a link swapped in between is refused, not followed.
// openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) where the kernel has it
// (Linux 5.6), else a walk of one component at a time with O_NOFOLLOW.
// `folder` itself is opened as named, links followed. Errors as
// open_regular_file's, named "<folder>/<relative>", and "<folder>/<relative>:
// refused: it leads out of the folder <folder> (through a symbolic link or
// \"..\"); only files inside it may be opened" (invalid_argument).
Result<RegularFile> open_regular_file_beneath(const std::filesystem::path& folder,
                                              const std::filesystem::path& relative);

namespace detail {
// How open_regular_file_beneath resolves the path: kernel is openat2 when
// the kernel has it (else walk), walk always walks. Tests run both.
enum class BeneathResolution { kernel, walk };
Result<RegularFile> open_regular_file_beneath(const std::filesystem::path& folder,
                                              const std::filesystem::path& relative,
                                              BeneathResolution how);
}  // namespace detail

// The whole of a regular file, refused (invalid_argument) when it is larger
// than max_bytes: "<path>: the config is 5000000 bytes, above the limit of
// 1048576". `what` names the file's role in that message ("config", "plan").
// Reads stop at max_bytes even if the file grows meanwhile.
Result<std::string> read_regular_file(const std::filesystem::path& path, uint64_t max_bytes,
                                      std::string_view what);

// Refuses to write over `path` when something other than a regular file is
// there (a write would replace a device node, a FIFO, a folder): "<path>:
// not a regular file (a character device); it is not replaced". OK when
// nothing is there; a symlink counts as what it points to.
Status check_replaceable(const std::filesystem::path& path);

}  // namespace devalloc
