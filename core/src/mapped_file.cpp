#include <devalloc/core/mapped_file.hpp>

#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include <sys/mman.h>

#include <cerrno>
#include <string>
#include <system_error>

namespace devalloc {

Result<std::shared_ptr<const MappedFile>> MappedFile::open(
    const std::filesystem::path& path) {
  Result<RegularFile> file = open_regular_file(path);
  if (!file.ok()) return file.status();
  const uint64_t size = file->size();
  if (size == 0) {
    // mmap rejects a length of 0.
    return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0));
  }
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file->fd(), 0);
  if (data == MAP_FAILED) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(path.string()) + ": cannot map " + std::to_string(size) +
                      " bytes: " + std::system_category().message(errno));
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
