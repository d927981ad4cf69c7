#include "atomic_write.hpp"

#include <devalloc/regular_file.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <system_error>

namespace devalloc::detail {

namespace {

Status io_error(const std::filesystem::path& path, const std::string& what, int error) {
  return Status(StatusCode::invalid_argument,
                path.string() + ": " + what + ": " + std::system_category().message(error));
}

Status write_all(int fd, const std::filesystem::path& path, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return io_error(path, "cannot write", errno);
    }
    bytes = bytes.subspan(static_cast<size_t>(written));
  }
  return Status();
}

}  // namespace

Status write_file_atomically(const std::filesystem::path& path,
                             std::span<const std::span<const std::byte>> parts) {
  // A rename would put a file where a device node or a FIFO was (as root,
  // "-o /dev/null" would replace /dev/null).
  if (Status s = check_replaceable(path); !s.ok()) return s;
  // Unique within the process too, for concurrent writers of one path.
  static std::atomic<unsigned> counter{0};
  std::filesystem::path temporary = path;
  temporary += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);

  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(temporary, "cannot create", errno);
  Status status;
  for (std::span<const std::byte> part : parts) {
    status = write_all(fd, temporary, part);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = io_error(temporary, "cannot flush", errno);
  if (::close(fd) != 0 && status.ok()) status = io_error(temporary, "cannot close", errno);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = io_error(path, "cannot rename " + temporary.filename().string() + " to it", errno);
  }
  if (!status.ok()) ::unlink(temporary.c_str());
  return status;
}

}  // namespace devalloc::detail
