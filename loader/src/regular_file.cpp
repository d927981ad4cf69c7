#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

namespace devalloc {

namespace {

std::string errno_text(int error) { return std::system_category().message(error); }

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

Status invalid(const std::filesystem::path& path, const std::string& reason) {
  return Status(StatusCode::invalid_argument, path_for_message(path.string()) + ": " + reason);
}

FileVersion version_of(const struct stat& st) {
  FileVersion v;
  v.device = static_cast<uint64_t>(st.st_dev);
  v.inode = static_cast<uint64_t>(st.st_ino);
  v.size = st.st_size < 0 ? 0 : static_cast<uint64_t>(st.st_size);
  v.links = static_cast<uint64_t>(st.st_nlink);
  v.modified_seconds = static_cast<int64_t>(st.st_mtim.tv_sec);
  v.modified_nanoseconds = static_cast<int64_t>(st.st_mtim.tv_nsec);
  v.changed_seconds = static_cast<int64_t>(st.st_ctim.tv_sec);
  v.changed_nanoseconds = static_cast<int64_t>(st.st_ctim.tv_nsec);
  return v;
}

}  // namespace

int read_file_version(int fd, FileVersion* version) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno;
  *version = version_of(st);
  return 0;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      version_(other.version_),
      mode_(other.mode_),
      owner_(other.owner_) {}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    version_ = other.version_;
    mode_ = other.mode_;
    owner_ = other.owner_;
  }
  return *this;
}

Result<RegularFile> open_regular_file(const std::filesystem::path& path) {
  if (path.native().find('\0') != std::string::npos) {
    return invalid(path, "path contains a NUL byte");
  }
  const auto cannot_open = [&](int error) {
    const bool out_of_resources = error == EMFILE || error == ENFILE || error == ENOMEM;
    return Status(out_of_resources ? StatusCode::out_of_host_memory : StatusCode::invalid_argument,
                  path_for_message(path.string()) + ": cannot open: " + errno_text(error));
  };
  // Opening for reading acts on what is not a regular file: a device's
  // driver runs its open (a watchdog starts counting down, a serial line
  // raises DTR) and a FIFO's waiting writer is let through. So the path is
  // first opened with O_PATH, which does neither, and checked; only a
  // regular file is then opened for reading, through /proc/self/fd: the
  // very file checked, whatever was renamed over the path meanwhile.
  RegularFile probe;
  probe.fd_ = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (probe.fd_ < 0) return cannot_open(errno);
  struct stat checked {};
  if (::fstat(probe.fd_, &checked) != 0) return invalid(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(checked.st_mode)) {
    return invalid(path, std::string("not a regular file (") + kind_of(checked.st_mode) + ")");
  }
  constexpr int kReadFlags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  RegularFile file;
  file.fd_ = ::open(("/proc/self/fd/" + std::to_string(probe.fd_)).c_str(), kReadFlags);
  if (file.fd_ < 0 && (errno == ENOENT || errno == EMFILE || errno == ENFILE)) {
    // No /proc, or no second descriptor (a process at its limit still
    // opens a file with the one it has left): by the path again, which
    // another program may have pointed elsewhere since (the checks below
    // still refuse anything but the file checked, after its open).
    ::close(probe.release());
    file.fd_ = ::open(path.c_str(), kReadFlags);
  }
  if (file.fd_ < 0) return cannot_open(errno);
  struct stat info {};
  if (::fstat(file.fd_, &info) != 0) return invalid(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(info.st_mode)) {
    return invalid(path, std::string("not a regular file (") + kind_of(info.st_mode) + ")");
  }
  if (info.st_dev != checked.st_dev || info.st_ino != checked.st_ino) {
    return invalid(path, "replaced by another file while it was opened");
  }
  // Reads of a regular file never block; clearing the flag keeps it that way
  // for whoever reads through this descriptor.
  const int flags = ::fcntl(file.fd_, F_GETFL);
  if (flags >= 0) ::fcntl(file.fd_, F_SETFL, flags & ~O_NONBLOCK);
  file.version_ = version_of(info);
  file.mode_ = static_cast<uint32_t>(info.st_mode);
  file.owner_ = static_cast<uint32_t>(info.st_uid);
  return file;
}

Result<std::string> read_regular_file(const std::filesystem::path& path, uint64_t max_bytes,
                                      std::string_view what) {
  Result<RegularFile> file = open_regular_file(path);
  if (!file.ok()) return file.status();
  if (file->size() > max_bytes) {
    return invalid(path, "the " + std::string(what) + " is " + std::to_string(file->size()) +
                             " bytes, above the limit of " + std::to_string(max_bytes) +
                             " bytes");
  }
  std::string text(static_cast<size_t>(file->size()), '\0');
  size_t done = 0;
  while (true) {
    if (done == text.size()) {
      // The file may have grown since fstat: read on, up to one byte past
      // the limit.
      if (text.size() > max_bytes) {
        return invalid(path, "the " + std::string(what) + " grew past the limit of " +
                                 std::to_string(max_bytes) + " bytes while it was read");
      }
      text.resize(static_cast<size_t>(std::min<uint64_t>(max_bytes + 1, text.size() + 65536)));
    }
    const ssize_t got = ::read(file->fd(), text.data() + done, text.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return invalid(path, "cannot read: " + errno_text(errno));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  text.resize(done);
  return text;
}

Status check_replaceable(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return Status();  // nothing there (or not reachable)
  if (S_ISREG(info.st_mode)) return Status();
  return invalid(path, std::string("not a regular file (") + kind_of(info.st_mode) +
                           "); it is not replaced");
}

}  // namespace devalloc
