// Reading and writing safetensors files: an 8-byte little-endian header
// length, a JSON header, then the tensor bytes. docs/safetensors.md lists
// what the reader accepts and rejects.
#pragma once

#include <devalloc/core/dtype.hpp>
#include <devalloc/core/mapped_file.hpp>
#include <devalloc/core/name_index.hpp>
#include <devalloc/status.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc {

// Headers above this are rejected before parsing; the reference
// implementation's limit.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// A header nests at most this deep: the header object, a tensor entry or
// "__metadata__", and a shape or data_offsets array. Deeper nesting is refused
// where it starts, before it is read.
inline constexpr size_t kMaxSafetensorsHeaderDepth = 3;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::u8;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;  // of the first byte, from the start of the file
  uint64_t nbytes = 0;
};

// An opened, fully validated safetensors file. Immutable; its bytes stay
// mapped while any shared_ptr to it, or to its mapping(), is alive.
class SafetensorsFile {
 public:
  // Maps the file and validates the whole header; on success the tensors'
  // bytes tile the data section exactly (no overlap, no gap, nothing after). Errors are invalid_argument and read
  // "<path>: <reason>" or "<path>: tensor \"<name>\": <reason>".
  // beneath: as MappedFile::open's (a plan's source file that must lie in
  // the plan's folder).
  static Result<std::shared_ptr<const SafetensorsFile>> open(
      const std::filesystem::path& path, const std::filesystem::path& beneath = {});

  const std::filesystem::path& path() const { return mapping_->path(); }
  // In increasing offset order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  // The same, looking at tensors()[hint] first: a caller that walks the
  // file's tensors in order passes the index after the last one it found
  // and skips the hash lookup. Any hint is safe.
  const SafetensorsTensor* find(std::string_view name, size_t hint) const;
  // The tensor's bytes inside the mapping; `tensor` must come from this file.
  std::span<const std::byte> bytes(const SafetensorsTensor& tensor) const;
  // The header's "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Where the data section starts: 8 + header length.
  uint64_t data_offset() const { return data_offset_; }
  const std::shared_ptr<const MappedFile>& mapping() const { return mapping_; }

 private:
  SafetensorsFile() = default;
  // index_ points into tensors_: never copied.
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  static Result<std::shared_ptr<const SafetensorsFile>> open_checked(
      const std::filesystem::path& path, const std::filesystem::path& beneath);

  // (Re)builds index_ from tensors_; false when a name appears twice (then
  // index_ holds the first of each name).
  bool build_index() const;

  std::shared_ptr<const MappedFile> mapping_;
  std::vector<SafetensorsTensor> tensors_;
  // name -> tensors_ index; the names are tensors_'s, which never change
  // after open. Built at open when the header's names could repeat, else
  // at the first find that its hint misses: a file read in order (a plan's
  // load) never builds it.
  mutable std::mutex index_mutex_;
  mutable std::atomic<bool> indexed_{false};
  mutable NameIndex index_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_offset_ = 0;
};

// Opens each file once. Keyed by the path as given; callers that want two
// spellings of one file to share an entry pass canonical paths.
//
// An entry holds the file it opened, as it was then: a file replaced by a
// rename afterwards (a new inode at the path) is not seen, the entry keeps
// serving the file it opened (drop the cache, or use a new one, to see the
// new file). A file modified in place since (the same inode, new bytes:
// MappedFile::check_unchanged, one fstat per open) can no longer be served
// by its old header: the next open of its path opens the path again, into
// a new entry (what a load holds of the old one stays as it was). A failed
// open is not remembered: the next open of the path tries again.
// Thread-safe.
//
// beneath: as MappedFile::open's, for a path the cache opens now. An entry
// serves by its path, however it was opened: one that the caller's own
// open put there (a plan builder's, by path) is the caller's word, and the
// loads of devalloc open their sources beneath the plan's folder into
// caches of their own or the caller's.
class SafetensorsCache {
 public:
  Result<std::shared_ptr<const SafetensorsFile>> open(
      const std::filesystem::path& path, const std::filesystem::path& beneath = {});

 private:
  std::mutex mutex_;
  std::map<std::filesystem::path, std::shared_ptr<const SafetensorsFile>> files_;
};

struct SafetensorsWriteTensor {
  std::string name;
  DType dtype = DType::u8;
  std::vector<uint64_t> shape;
  std::span<const std::byte> bytes;  // byte_size(dtype, shape) bytes
};

// Writes a safetensors file: tensors packed in the given order with no gaps,
// the header listing "__metadata__" (when not empty) and then the tensors in
// that order, padded with spaces so the data starts at a multiple of 8.
// Writes "<path>.tmp-<pid>-<n>" next to `path` and renames it over `path`, so
// readers see the old file or the new one, never a partial one. Rejects
// (invalid_argument) a duplicate or reserved ("__metadata__") name and bytes
// of the wrong size.
Status write_safetensors(const std::filesystem::path& path,
                         std::span<const SafetensorsWriteTensor> tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace devalloc
