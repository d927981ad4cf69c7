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

Status write_file_atomically(const std::filesystem::path& path,
                             std::span<const std::span<const std::byte>> parts) {
  // A rename would put a file where a device node or a FIFO was (as root,
  // "-o /dev/null" would replace /dev/null).
  if (Status s = check_replaceable(path); !s.ok()) return s;
  // Unique within the process too, for concurrent writers of one path.
  static std::atomic<unsigned> counter{0};
  std::filesystem::path temporary = path;
  temporary += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  // Errors name the file asked for (the temporary one is gone by then):
  // "<path>: not written: cannot write the temporary file <name>: <reason>".
  const auto failed = [&](const char* what, int error) {
    return io_error(path, std::string("not written: ") + what + " the temporary file " +
                              escaped(temporary.filename().string()),
                    error);
  };

  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return failed("cannot create", errno);
  // Closed and removed however this ends, an exception included, unless
  // renamed into place.
  struct Temporary {
    int fd;
    const std::filesystem::path& path;
    bool renamed = false;
    ~Temporary() {
      if (fd >= 0) ::close(fd);
      if (!renamed) ::unlink(path.c_str());
    }
  } held{fd, temporary};
  for (std::span<const std::byte> part : parts) {
    if (int error = write_all(held.fd, part); error != 0) return failed("cannot write", error);
  }
  if (::fsync(held.fd) != 0) return failed("cannot flush", errno);
  const int closed = ::close(std::exchange(held.fd, -1));
  if (closed != 0) return failed("cannot close", errno);
  if (::rename(temporary.c_str(), path.c_str()) != 0) return failed("cannot rename", errno);
  held.renamed = true;
  return Status();
}

}  // namespace devalloc::detail
