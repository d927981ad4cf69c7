#include "file_check.hpp"

#include "mapping_guard.hpp"

#include <cstring>

// Inlined, as in verify.cpp: the installed core does not need libxxhash.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace devalloc::detail {

// The rows go through a buffer: one hash update per 4 KiB rather than
// three per row (the update's own cost was most of it). A digest per file
// of a plan: small.
struct RowsDigest::State {
  XXH3_state_t xxh;
  size_t held = 0;
  unsigned char buffer[4 << 10];

  void append(const void* data, size_t n) {
    if (n == 0) return;  // an empty shape's data() may be null
    if (n > sizeof buffer - held) {
      flush();
      if (n > sizeof buffer) {
        XXH3_64bits_update(&xxh, data, n);
        return;
      }
    }
    std::memcpy(buffer + held, data, n);
    held += n;
  }
  void flush() {
    XXH3_64bits_update(&xxh, buffer, held);
    held = 0;
  }
};

RowsDigest::RowsDigest() : state_(std::make_unique<State>()) { XXH3_64bits_reset(&state_->xxh); }
RowsDigest::~RowsDigest() = default;
RowsDigest::RowsDigest(RowsDigest&& other) noexcept = default;

void RowsDigest::add(std::string_view name, DType dtype, std::span<const uint64_t> shape) {
  // The name's length first, so that no two rows run together alike.
  const uint64_t head[3] = {name.size(), static_cast<uint64_t>(dtype), shape.size()};
  state_->append(head, sizeof head);
  state_->append(name.data(), name.size());
  state_->append(shape.data(), shape.size_bytes());
}

uint64_t RowsDigest::value() const {
  state_->flush();
  return XXH3_64bits_digest(&state_->xxh);
}

std::optional<uint64_t> header_hash(const MappedFile& file, uint64_t header_bytes) {
  const uint64_t size = file.version().size;
  if (size < 8 || header_bytes > size - 8) return std::nullopt;
  uint64_t hash = 0;
  const std::byte* begin = file.data();
  const uint64_t n = 8 + header_bytes;
  auto read = [&]() noexcept { hash = XXH3_64bits(begin, static_cast<size_t>(n)); };
  if (!guarded_read(begin, n, read, nullptr)) return std::nullopt;
  return hash;
}

RowsByFile::RowsByFile(const Plan& plan) {
  std::vector<size_t>* last = nullptr;
  std::string_view last_file;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const std::optional<PlanSource>& source = plan.tensors[i].source;
    if (!source) continue;
    // Plans mostly list a file's tensors together.
    if (last == nullptr || source->file != last_file) {
      last_file = source->file;
      last = &rows_[last_file];
    }
    last->push_back(i);
  }
}

std::span<const size_t> RowsByFile::rows_of(std::string_view source_file) const {
  const auto found = rows_.find(source_file);
  if (found == rows_.end()) return {};
  return found->second;
}

bool planned_offsets(const Plan& plan, std::span<const size_t> rows,
                     const PlanFileCheck& check, const MappedFile& file,
                     std::vector<uint64_t>& offset_of) {
  const uint64_t size = file.version().size;
  if (size < 8 || check.header_bytes > size - 8) return false;
  if (offset_of.size() < plan.tensors.size()) offset_of.resize(plan.tensors.size());
  RowsDigest digest;
  uint64_t end = 8 + check.header_bytes;  // of the tensors so far
  for (size_t i : rows) {
    const PlanTensor& t = plan.tensors[i];
    if (t.source->slice || t.source->key != t.name) return false;
    const Result<uint64_t> nbytes = byte_size(t.dtype, t.shape);
    if (!nbytes.ok() || *nbytes > size - end) return false;
    digest.add(t.name, t.dtype, t.shape);
    offset_of[i] = end;
    end += *nbytes;
  }
  if (end != size || digest.value() != check.rows_xxh3) return false;
  const std::optional<uint64_t> hash = header_hash(file, check.header_bytes);
  return hash && *hash == check.header_xxh3;
}

PlannedFile open_planned(const Plan& plan, const std::string& source_file,
                         const std::filesystem::path& path,
                         const std::filesystem::path& beneath,
                         std::optional<RowsByFile>& rows, std::vector<uint64_t>& offset_of) {
  const auto check = plan.file_checks.find(source_file);
  if (check == plan.file_checks.end()) return {};
  if (!rows) rows.emplace(plan);
  Result<std::shared_ptr<const MappedFile>> file = MappedFile::open(path, beneath);
  if (!file.ok()) return {};
  if (!planned_offsets(plan, rows->rows_of(source_file), check->second, **file, offset_of)) {
    return {};
  }
  return PlannedFile{std::move(*file), 8 + check->second.header_bytes};
}

}  // namespace devalloc::detail
