// A plan's record of a source file (PlanFileCheck), so that a load need not
// read the file's header again: the header's length and XXH3 hash, and a
// digest of the plan's own rows naming the file. When all three still
// match, the rows are the file's tensors in data order, as build_plan
// listed them from this very header, and each tensor's bytes start where
// the one before it ends; otherwise the load reads the header as ever.
#pragma once

#include <devalloc/core/mapped_file.hpp>
#include <devalloc/core/plan.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace devalloc::detail {

// XXH3-64 over a file's rows, in plan order: each row's name, dtype and
// shape. value() is the digest of the rows added so far.
class RowsDigest {
 public:
  RowsDigest();
  ~RowsDigest();
  RowsDigest(RowsDigest&& other) noexcept;
  RowsDigest& operator=(RowsDigest&&) = delete;
  RowsDigest(const RowsDigest&) = delete;
  void add(std::string_view name, DType dtype, std::span<const uint64_t> shape);
  uint64_t value() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// XXH3-64 of the file's first 8 + header_bytes bytes (the length and the
// header), read through the SIGBUS guard; none when the file is shorter or
// was cut while it was read.
std::optional<uint64_t> header_hash(const MappedFile& file, uint64_t header_bytes);

// The plan's constants grouped by source file (as the sources name it), in
// plan order: one pass over the plan, however many files it names.
class RowsByFile {
 public:
  explicit RowsByFile(const Plan& plan);
  // Indices into Plan::tensors; empty for a file no tensor names.
  std::span<const size_t> rows_of(std::string_view source_file) const;

 private:
  std::unordered_map<std::string_view, std::vector<size_t>> rows_;
};

// When `check` holds for `file`, the mapped source file whose rows (plan
// tensor indices, in plan order) are `rows`: true, and offset_of[i] set for
// each row i to the file offset of its first byte. False (nothing to
// trust) when a row is a slice or has a key other than its name, a row's
// size does not compute, the rows or the header differ from what was
// planned, or the file's size is not header + tensors.
bool planned_offsets(const Plan& plan, std::span<const size_t> rows,
                     const PlanFileCheck& check, const MappedFile& file,
                     std::vector<uint64_t>& offset_of);

// A source file a load or validate_plan takes as planned: mapped, its
// header not read. Null `mapping` when the plan has no check for it, the
// file does not open (the header's reader reports why) or the check does
// not hold.
struct PlannedFile {
  std::shared_ptr<const MappedFile> mapping;
  uint64_t data_offset = 0;  // 8 + the header's length
};
// The file at `path`, which the rows name as `source_file`, opened as
// SafetensorsCache opens it (beneath the folder when not empty); `rows` is
// made on first use, offset_of filled as planned_offsets fills it.
PlannedFile open_planned(const Plan& plan, const std::string& source_file,
                         const std::filesystem::path& path,
                         const std::filesystem::path& beneath,
                         std::optional<RowsByFile>& rows, std::vector<uint64_t>& offset_of);

}  // namespace devalloc::detail
