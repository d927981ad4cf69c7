#include <devalloc/core/mapped_file.hpp>

#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>
#include <devalloc/regular_file.hpp>

#include "mapping_guard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace devalloc {

namespace {

bool same_modified(const FileVersion& a, const FileVersion& b) {
  return a.modified_seconds == b.modified_seconds &&
         a.modified_nanoseconds == b.modified_nanoseconds;
}

bool same_changed(const FileVersion& a, const FileVersion& b) {
  return a.changed_seconds == b.changed_seconds &&
         a.changed_nanoseconds == b.changed_nanoseconds;
}

// The status change time counts only while the link count is the same: a
// rename over the file unlinks it (one link fewer), which moves that time
// without touching a byte.
bool same_version(const FileVersion& opened, const FileVersion& now) {
  return opened.device == now.device && opened.inode == now.inode && opened.size == now.size &&
         same_modified(opened, now) && (opened.links != now.links || same_changed(opened, now));
}

// "2024-12-04 14:10:03.123456789 UTC"
std::string time_text(int64_t seconds, int64_t nanoseconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm utc{};
  char text[64];
  if (::gmtime_r(&t, &utc) == nullptr ||
      std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &utc) == 0) {
    std::snprintf(text, sizeof text, "%" PRId64, seconds);
  }
  char fraction[16];
  std::snprintf(fraction, sizeof fraction, ".%09" PRId64, nanoseconds);
  return std::string(text) + fraction + " UTC";
}

}  // namespace

Result<std::shared_ptr<const MappedFile>> MappedFile::open(
    const std::filesystem::path& path, const std::filesystem::path& beneath) {
  return detail::catch_as_status([&]() -> Result<std::shared_ptr<const MappedFile>> {
    Result<RegularFile> file =
        beneath.empty() ? open_regular_file(path)
                        : open_regular_file_beneath(beneath, path.lexically_relative(beneath));
    if (!file.ok()) return file.status();
    // The version, from fstat at open, before a byte was read: a write
    // after it moves it.
    const FileVersion version = file->version();
    const uint64_t size = version.size;
    if (size == 0) {
      // mmap rejects a length of 0. The descriptor is kept all the same:
      // check_unchanged reads the file's version through it.
      const int fd = file->release();
      try {
        return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, version, fd));
      } catch (...) {
        ::close(fd);
        throw;
      }
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
      mapped = new MappedFile(path, static_cast<const std::byte*>(data), version, fd);
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

Status MappedFile::check_unchanged(std::string_view when) const {
  FileVersion now;
  if (const int error = read_file_version(fd_, &now); error != 0) {
    return detail::without_exceptions(path_, "its status", [&] {
      return Status(StatusCode::io_error,
                    path_for_message(path_.string()) + ": cannot tell whether it was modified " +
                        std::string(when) + ": fstat: " + std::system_category().message(error));
    });
  }
  if (same_version(version_, now)) return Status();
  return detail::without_exceptions(path_, "its status", [&] {
    std::string what;
    if (version_.size != now.size) {
      what = "its size went from " + std::to_string(version_.size) + " to " +
             std::to_string(now.size) + " bytes";
    }
    if (!same_modified(version_, now)) {
      what += (what.empty() ? "its modification time went from " : ", its modification time from ") +
              time_text(version_.modified_seconds, version_.modified_nanoseconds) + " to " +
              time_text(now.modified_seconds, now.modified_nanoseconds);
    } else if (!same_changed(version_, now)) {
      what += (what.empty() ? "its status change time went from " : ", its status change time from ") +
              time_text(version_.changed_seconds, version_.changed_nanoseconds) + " to " +
              time_text(now.changed_seconds, now.changed_nanoseconds) +
              " (written with its modification time kept, or chmod-ed, chown-ed or renamed "
              "itself)";
    }
    return Status(StatusCode::data_loss,
                  path_for_message(path_.string()) + ": modified in place " + std::string(when) +
                      " (" + what +
                      "): the header and offsets read from it no longer describe its bytes; "
                      "replace a file by writing a new one and renaming it over the old one "
                      "(as write_safetensors does), which leaves every reader the file it "
                      "opened");
  });
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace devalloc
