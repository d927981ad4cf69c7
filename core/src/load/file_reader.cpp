#include "file_reader.hpp"

#include <devalloc/input_text.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <system_error>

namespace devalloc::load {

namespace {

std::string errno_text(int error) { return std::system_category().message(error); }

}  // namespace

Status pread_all(int fd, void* dst, uint64_t n, uint64_t offset, const MappedFile& file,
                 uint64_t* got) {
  auto* out = static_cast<std::byte*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, static_cast<size_t>(n - done),
                              static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      // A read of a file that opened fails for the device's sake (EIO),
      // not the argument's.
      const int error = errno;
      const StatusCode code = status_code_from_errno(error);
      return Status(code == StatusCode::invalid_argument ? StatusCode::io_error : code,
                    path_for_message(file.path().string()) + ": cannot read " + std::to_string(n) +
                        " bytes at offset " + std::to_string(offset) + ": " +
                        errno_text(error));
    }
    if (r == 0) break;
    done += static_cast<uint64_t>(r);
  }
  if (got != nullptr) {
    *got = done;
    return Status();
  }
  if (done < n) {
    return Status(StatusCode::data_loss,
                  path_for_message(file.path().string()) + ": ends before offset " +
                      std::to_string(offset + n) + " (was it truncated?)");
  }
  return Status();
}

ReadMode ReadChooser::pick(uint64_t nbytes, bool* timed) {
  *timed = false;
  if (!probing_ || nbytes < kMinBytes) return mode_;
  std::lock_guard lock(mutex_);
  if (!probing_) return mode_;
  const int i = turn_++ % 2;
  if (taken_[i] >= kSamples) return mode_;
  ++taken_[i];
  *timed = true;
  return kModes[i];
}

void ReadChooser::record(ReadMode mode, uint64_t nbytes, double seconds) {
  std::lock_guard lock(mutex_);
  const int i = mode == kModes[0] ? 0 : 1;
  bytes_[i] += nbytes;
  seconds_[i] += seconds;
  ++done_[i];
  if (done_[0] >= kSamples && done_[1] >= kSamples) {
    // bytes / seconds, compared without dividing by a zero time.
    mode_ = bytes_[0] * seconds_[1] >= bytes_[1] * seconds_[0] ? kModes[0] : kModes[1];
    probing_ = false;
    measured_ = true;
  }
}

Status read_piece(ReadChooser& chooser, const MappedFile& file, std::byte* dst,
                  uint64_t offset, uint64_t nbytes) {
  bool timed = false;
  const ReadMode mode = chooser.pick(nbytes, &timed);
  const auto start = timed ? std::chrono::steady_clock::now()
                           : std::chrono::steady_clock::time_point{};
  Status read;
  if (mode == ReadMode::mmap) {
    // Guarded: another program may truncate the file under the mapping.
    read = file.copy_to(offset, nbytes, dst);
  } else {
    read = pread_all(file.fd(), dst, nbytes, offset, file);
  }
  if (timed && read.ok()) {
    chooser.record(mode, nbytes,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                       .count());
  }
  return read;
}

Status read_step(ReadChooser& chooser, const CopyStep& s, uint64_t offset, uint64_t nbytes,
                 std::byte* dst) {
  Status read;
  for_each_run(s, offset, nbytes, [&](uint64_t position, uint64_t at, uint64_t length) {
    if (read.ok()) read = read_piece(chooser, *s.file, dst + at, position, length);
  });
  return read;
}

DirectIoFiles::~DirectIoFiles() {
  for (int fd : fds_) ::close(fd);
}

void DirectIoFiles::open(const MappedFile* file) {
  if (fd_of_.count(file) != 0) return;
  // The file the load mapped, opened again through its own descriptor:
  // whatever its path names by now (renamed over, replaced by a FIFO),
  // this is the same inode. Only without /proc, by its path:
  // O_NONBLOCK and O_NOCTTY as open_regular_file, since the path may
  // name a FIFO or a device by now, whose open(2) would wait for a
  // writer; then checked to be the same inode.
  const std::string own = "/proc/self/fd/" + std::to_string(file->fd());
  int fd = ::open(own.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NOCTTY);
  if (fd < 0 && errno == ENOENT) {
    fd = ::open(file->path().c_str(),
                O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK | O_NOCTTY);
  }
  struct stat a {}, b {};
  if (fd >= 0 && (::fstat(fd, &a) != 0 || ::fstat(file->fd(), &b) != 0 ||
                  a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
    // Not the file that was mapped (renamed over since): do not use it.
    ::close(fd);
    fd = -1;
  }
  if (fd >= 0) {
    // The mapped regular file: its reads never block; clear the flag.
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  }
  if (fd < 0) fell_back_ = true;
  if (fd >= 0) fds_.push_back(fd);
  fd_of_[file] = fd;
}

int DirectIoFiles::fd(const MappedFile* file) const {
  const auto it = fd_of_.find(file);
  return it == fd_of_.end() ? -1 : it->second;
}

}  // namespace devalloc::load
