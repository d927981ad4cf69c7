#include <devalloc/core/mapped_file.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

namespace devalloc {

namespace {

std::string errno_text(int error) { return std::system_category().message(error); }

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

Result<std::shared_ptr<const MappedFile>> MappedFile::open(
    const std::filesystem::path& path) {
  const std::string name = path.string();
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return Status(StatusCode::invalid_argument,
                  name + ": cannot open: " + errno_text(errno));
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    return Status(StatusCode::invalid_argument,
                  name + ": cannot stat: " + errno_text(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    return Status(StatusCode::invalid_argument, name + ": not a regular file");
  }
  const auto size = static_cast<uint64_t>(info.st_size);
  if (size == 0) {
    // mmap rejects a length of 0.
    return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0));
  }
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (data == MAP_FAILED) {
    return Status(StatusCode::invalid_argument,
                  name + ": cannot map " + std::to_string(size) +
                      " bytes: " + errno_text(errno));
  }
  // The mapping keeps its own reference to the file; the descriptor can go.
  return std::shared_ptr<const MappedFile>(
      new MappedFile(path, static_cast<const std::byte*>(data), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
}

}  // namespace devalloc
