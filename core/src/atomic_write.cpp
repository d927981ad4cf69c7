#include "atomic_write.hpp"

#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

namespace devalloc::detail {

namespace {

Status io_error(const std::filesystem::path& path, const std::string& what, int error) {
  return Status(StatusCode::invalid_argument, path_for_message(path.string()) + ": " + what +
                                                  ": " + std::system_category().message(error));
}

// 0, or the errno of the write that failed.
int write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes = bytes.subspan(static_cast<size_t>(written));
  }
  return 0;
}

}  // namespace

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (created_) ::unlink(temporary_.c_str());
}

// "<path>: not written: cannot write the temporary file <name>: <reason>":
// the file asked for, since the temporary one is gone by then.
Status AtomicFile::failed(const char* what, int error) const {
  return io_error(path_, std::string("not written: ") + what + " the temporary file " +
                             escaped(temporary_.filename().string()),
                  error);
}

Status AtomicFile::open() {
  // A rename would put a file where a device node or a FIFO was (as root,
  // "-o /dev/null" would replace /dev/null).
  if (Status s = check_replaceable(path_); !s.ok()) return s;
  // Unique within the process too, for concurrent writers of one path.
  static std::atomic<unsigned> counter{0};
  temporary_ = path_;
  temporary_ += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) return failed("cannot create", errno);
  created_ = true;
  return Status();
}

Status AtomicFile::write(std::span<const std::byte> bytes) {
  if (int error = write_all(fd_, bytes); error != 0) return failed("cannot write", error);
  // The disk starts on these bytes now (Linux), so that commit()'s fsync
  // waits for the last of them rather than for the whole file; a failure
  // here is fsync's to report.
#ifdef SYNC_FILE_RANGE_WRITE
  (void)::sync_file_range(fd_, static_cast<off_t>(written_), static_cast<off_t>(bytes.size()),
                          SYNC_FILE_RANGE_WRITE);
#endif
  written_ += bytes.size();
  return Status();
}

Status AtomicFile::commit() {
  if (::fsync(fd_) != 0) return failed("cannot flush", errno);
  const int closed = ::close(std::exchange(fd_, -1));
  if (closed != 0) return failed("cannot close", errno);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) return failed("cannot rename", errno);
  created_ = false;
  return Status();
}

Status write_file_atomically(const std::filesystem::path& path,
                             std::span<const std::span<const std::byte>> parts) {
  AtomicFile file(path);
  if (Status s = file.open(); !s.ok()) return s;
  for (std::span<const std::byte> part : parts) {
    if (Status s = file.write(part); !s.ok()) return s;
  }
  return file.commit();
}

}  // namespace devalloc::detail
