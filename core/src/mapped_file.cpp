#include <devalloc/core/mapped_file.hpp>

#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>
#include <devalloc/regular_file.hpp>

#include "mapping_guard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace devalloc {

Result<std::shared_ptr<const MappedFile>> MappedFile::open(
    const std::filesystem::path& path) {
  return detail::catch_as_status([&]() -> Result<std::shared_ptr<const MappedFile>> {
    Result<RegularFile> file = open_regular_file(path);
    if (!file.ok()) return file.status();
    const uint64_t size = file->size();
    if (size == 0) {
      // mmap rejects a length of 0.
      return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0, -1));
    }
    void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file->fd(), 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      // ENOMEM: no address space left for it (ulimit -v), not a bad file.
      return Status(error == ENOMEM ? StatusCode::out_of_host_memory : StatusCode::invalid_argument,
                    path_for_message(path.string()) + ": cannot map " + std::to_string(size) +
                        " bytes: " + std::system_category().message(error));
    }
    // The descriptor stays open with the mapping: the load pipeline may
    // pread the same file (the same inode, whatever was renamed over the
    // path since). It is the one opened, not a duplicate that the
    // descriptor limit could refuse.
    const int fd = file->release();
    MappedFile* mapped = nullptr;
    try {
      mapped = new MappedFile(path, static_cast<const std::byte*>(data), size, fd);
    } catch (...) {
      ::munmap(data, size);
      ::close(fd);
      throw;
    }
    return std::shared_ptr<const MappedFile>(mapped);  // deletes it if this throws
  }, detail::file_failure(path, "mapping"));
}

Status MappedFile::copy_to(uint64_t offset, uint64_t nbytes, void* dst) const {
  if (offset > size_ || nbytes > size_ - offset) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(path_.string()) + ": " + std::to_string(nbytes) +
                      " bytes from offset " + std::to_string(offset) + " are not inside its " +
                      std::to_string(size_) + " bytes");
  }
  if (nbytes == 0) return Status();
  const std::byte* from = data_ + offset;
  auto copy = [&]() noexcept { std::memcpy(dst, from, nbytes); };
  uint64_t fault = 0;
  if (detail::guarded_read(from, nbytes, copy, &fault)) return Status();
  return detail::lost_to_truncation(*this, offset + fault);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace devalloc
