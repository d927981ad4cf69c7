#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <string>
#include <string_view>
#include <vector>
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

namespace {

constexpr int kReadFlags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;

Status cannot_open(const std::filesystem::path& path, int error) {
  return Status(status_code_from_errno(error),
                path_for_message(path.string()) + ": cannot open: " + errno_text(error));
}

// A descriptor closed when this goes.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) noexcept : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// The kernel said openat2 is not there (ENOSYS, or EPERM from a seccomp
// filter that does not know it): the walk serves from then on.
std::atomic<bool> g_no_openat2{false};

// Prepends the parts of a link's target (or of a relative path) to `todo`.
void prepend_parts(std::string_view text, std::deque<std::string>* todo) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('/', start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) parts.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  todo->insert(todo->begin(), parts.begin(), parts.end());
}

// What RESOLVE_BENEATH does, one component at a time: each is opened with
// O_PATH | O_NOFOLLOW relative to the folder before it, a link's target is
// read from the link opened (never by name again) and walked in its place,
// ".." pops a folder and may not pop `root`, and an absolute target is
// refused. A descriptor (flags) of what `relative` names, or -errno: EXDEV
// for a way out of `root`.
int walk_beneath(int root, const std::filesystem::path& relative, int flags) {
  constexpr int kMaxLinks = 40;  // the kernel's own bound (ELOOP)
  std::vector<UniqueFd> folders;  // below root, the innermost last
  const auto current = [&] { return folders.empty() ? root : folders.back().get(); };
  std::deque<std::string> todo;
  prepend_parts(relative.native(), &todo);
  int links = 0;
  while (!todo.empty()) {
    const std::string name = std::move(todo.front());
    todo.pop_front();
    if (name == ".") continue;
    if (name == "..") {
      if (folders.empty()) return -EXDEV;
      folders.pop_back();
      continue;
    }
    UniqueFd step(::openat(current(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (step.get() < 0) return -errno;
    struct stat st {};
    if (::fstat(step.get(), &st) != 0) return -errno;
    if (S_ISLNK(st.st_mode)) {
      if (++links > kMaxLinks) return -ELOOP;
      std::string target(4096, '\0');
      const ssize_t n = ::readlinkat(step.get(), "", target.data(), target.size());
      if (n < 0) return -errno;
      if (static_cast<size_t>(n) >= target.size()) return -ENAMETOOLONG;
      if (n == 0) return -ENOENT;
      target.resize(static_cast<size_t>(n));
      if (target.front() == '/') return -EXDEV;
      prepend_parts(target, &todo);
      continue;
    }
    if (todo.empty()) {
      if ((flags & O_PATH) != 0) return step.release();
      // By name once more, without following: a link swapped in since is
      // refused (ELOOP), and the caller compares the file with the probe.
      const int fd = ::openat(current(), name.c_str(), flags | O_NOFOLLOW);
      return fd >= 0 ? fd : -errno;
    }
    if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
    folders.push_back(std::move(step));
  }
  // `relative` names a folder (".", "a/.."): the caller refuses it.
  const int fd = ::openat(current(), ".", flags);
  return fd >= 0 ? fd : -errno;
}

// `relative` opened with `flags` beneath `root`, or -errno.
int open_beneath(int root, const std::filesystem::path& relative, int flags,
                 detail::BeneathResolution how) {
  if (how == detail::BeneathResolution::kernel && !g_no_openat2.load()) {
    open_how request {};
    request.flags = static_cast<uint64_t>(flags);
    request.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    // EAGAIN: a rename elsewhere raced with a ".." of this lookup.
    for (int attempt = 0; attempt < 16; ++attempt) {
      const long fd = ::syscall(SYS_openat2, root, relative.c_str(), &request, sizeof request);
      if (fd >= 0) return static_cast<int>(fd);
      const int error = errno;
      if (error == EAGAIN || error == EINTR) continue;
      if (error != ENOSYS && error != EPERM) return -error;
      g_no_openat2.store(true);
      break;
    }
    if (!g_no_openat2.load()) return -EAGAIN;
  }
  return walk_beneath(root, relative, flags);
}

}  // namespace

namespace detail {

struct RegularFileAccess {
  // The file behind `probe` (an O_PATH descriptor, taken over), checked to
  // be a regular file and then opened for reading; reopen() (a descriptor
  // or -1 with errno) opens it again the way the probe was opened, for a
  // system without /proc.
  template <class Reopen>
  static Result<RegularFile> open_probed(const std::filesystem::path& path, int probe_fd,
                                         const Reopen& reopen) {
    RegularFile probe;
    probe.fd_ = probe_fd;
    struct stat checked {};
    if (::fstat(probe.fd_, &checked) != 0) return invalid(path, "cannot stat: " + errno_text(errno));
    if (!S_ISREG(checked.st_mode)) {
      return invalid(path, std::string("not a regular file (") + kind_of(checked.st_mode) + ")");
    }
    RegularFile file;
    file.fd_ = ::open(("/proc/self/fd/" + std::to_string(probe.fd_)).c_str(), kReadFlags);
    if (file.fd_ < 0 && (errno == ENOENT || errno == EMFILE || errno == ENFILE)) {
      // No /proc, or no second descriptor (a process at its limit still
      // opens a file with the one it has left): by the path again, which
      // another program may have pointed elsewhere since (the checks below
      // still refuse anything but the file checked, after its open).
      ::close(probe.release());
      file.fd_ = reopen();
    }
    if (file.fd_ < 0) return cannot_open(path, errno);
    struct stat info {};
    if (::fstat(file.fd_, &info) != 0) return invalid(path, "cannot stat: " + errno_text(errno));
    if (!S_ISREG(info.st_mode)) {
      return invalid(path, std::string("not a regular file (") + kind_of(info.st_mode) + ")");
    }
    if (info.st_dev != checked.st_dev || info.st_ino != checked.st_ino) {
      return invalid(path, "replaced by another file while it was opened");
    }
    // Reads of a regular file never block; clearing the flag keeps it that
    // way for whoever reads through this descriptor.
    const int flags = ::fcntl(file.fd_, F_GETFL);
    if (flags >= 0) ::fcntl(file.fd_, F_SETFL, flags & ~O_NONBLOCK);
    file.version_ = version_of(info);
    file.mode_ = static_cast<uint32_t>(info.st_mode);
    file.owner_ = static_cast<uint32_t>(info.st_uid);
    return file;
  }
};

}  // namespace detail

Result<RegularFile> open_regular_file(const std::filesystem::path& path) {
  if (path.native().find('\0') != std::string::npos) {
    return invalid(path, "path contains a NUL byte");
  }
  // Opening for reading acts on what is not a regular file: a device's
  // driver runs its open (a watchdog starts counting down, a serial line
  // raises DTR) and a FIFO's waiting writer is let through. So the path is
  // first opened with O_PATH, which does neither, and checked; only a
  // regular file is then opened for reading, through /proc/self/fd: the
  // very file checked, whatever was renamed over the path meanwhile.
  const int probe = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (probe < 0) return cannot_open(path, errno);
  return detail::RegularFileAccess::open_probed(
      path, probe, [&] { return ::open(path.c_str(), kReadFlags); });
}

Result<RegularFile> open_regular_file_beneath(const std::filesystem::path& folder,
                                              const std::filesystem::path& relative) {
  return detail::open_regular_file_beneath(folder, relative, detail::BeneathResolution::kernel);
}

Result<RegularFile> detail::open_regular_file_beneath(const std::filesystem::path& folder,
                                                      const std::filesystem::path& relative,
                                                      BeneathResolution how) {
  const std::filesystem::path path = folder / relative;
  if (path.native().find('\0') != std::string::npos) {
    return invalid(path, "path contains a NUL byte");
  }
  const auto leads_out = [&] {
    return invalid(path, "refused: it leads out of the folder " +
                             path_for_message(folder.string()) +
                             " (through a symbolic link or \"..\"); only files inside it "
                             "may be opened");
  };
  if (relative.empty() || relative.is_absolute()) return leads_out();
  UniqueFd root(::open(folder.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root.get() < 0) {
    const int error = errno;
    return Status(status_code_from_errno(error),
                  path_for_message(folder.string()) + ": cannot open the folder: " +
                      errno_text(error));
  }
  const int probe = open_beneath(root.get(), relative, O_PATH | O_CLOEXEC, how);
  if (probe == -EXDEV) return leads_out();
  if (probe < 0) return cannot_open(path, -probe);
  return detail::RegularFileAccess::open_probed(path, probe, [&] {
    const int fd = open_beneath(root.get(), relative, kReadFlags, how);
    if (fd >= 0) return fd;
    errno = -fd;
    return -1;
  });
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
  // One byte more than fstat said: a read that fills it finds a file that
  // grew, and only then is the text made larger (a doubling copy of a
  // 16 MB plan would touch 32 MB of fresh memory).
  std::string text;
  reserve_on_huge_pages(text, static_cast<size_t>(file->size()) + 1);
  text.resize(static_cast<size_t>(file->size()) + 1);
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
      return Status(StatusCode::io_error,
                    path_for_message(path.string()) + ": cannot read: " + errno_text(errno));
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
