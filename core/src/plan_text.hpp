// The text of a plan file (format version 2), written straight to the file
// a chunk at a time: by write_plan from a Plan, and by build_and_write_plan
// from the placement as it goes, so that both write the same bytes.
//
// One entry per line, so a plan stays readable and diffs stay small;
// tensors as rows, so that the text of a plan of many small tensors is not
// mostly keys.
#pragma once

#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>

#include "atomic_write.hpp"
#include "json_text.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace devalloc::detail {

// A tensor's source, as a row writes it.
struct PlanRowSource {
  std::string_view file;  // a path of the files table
  std::string_view key;
  std::optional<PlanSlice> slice;
};

// A tensor as a row: [name, dtype, shape, memory_id, offset, source].
struct PlanRow {
  std::string_view name;
  DType dtype = DType::u8;
  std::span<const uint64_t> shape;
  uint32_t memory_id = 0;
  uint64_t offset = 0;
  std::optional<PlanRowSource> source;  // none: scratch memory
};

// The "files" table: each source file once, in the order the rows first
// name it, and the index of a path in it.
class PlanFiles {
 public:
  // `path` is kept as a view: it must outlive the table.
  void add(std::string_view path, std::string_view first_user) {
    const size_t before = paths_.size();
    index_of(path);
    if (paths_.size() != before) first_users_.push_back(first_user);
  }
  const std::vector<std::string_view>& paths() const { return paths_; }
  // The first tensor whose source is paths()[i], to name in an error.
  std::string_view first_user(size_t i) const { return first_users_[i]; }
  // The tensors of a file usually follow each other: the last file found
  // is tried first.
  size_t index_of(std::string_view path) {
    if (last_ < paths_.size() && paths_[last_] == path) return last_;
    const auto [it, added] = index_.try_emplace(path, paths_.size());
    if (added) paths_.push_back(path);
    return last_ = it->second;
  }

 private:
  std::vector<std::string_view> paths_;
  std::vector<std::string_view> first_users_;
  std::unordered_map<std::string_view, size_t> index_;
  size_t last_ = SIZE_MAX;
};

// The text goes to the file a chunk at a time: writing a plan takes a
// chunk of memory, not its whole text.
class PlanSink {
 public:
  static constexpr size_t kChunkBytes = 1 << 20;

  explicit PlanSink(const std::filesystem::path& path) : path_(path), file_(path) {
    text_.text().reserve(kChunkBytes + (64 << 10));
  }
  Status open() { return file_.open(); }
  JsonText& text() { return text_; }

  // Hands the text to the file once a chunk is held (or, with `all`, what
  // is held). Past kMaxPlanBytes, or after a bad string, nothing more is
  // written: the plan will be refused, its length still counted.
  void flush(bool all);
  // After flush(true): the first thing wrong, or the file renamed into
  // place. A plan read_plan would refuse is not written.
  Status finish();

 private:
  const std::filesystem::path& path_;
  JsonText text_;
  AtomicFile file_;
  uint64_t bytes_ = 0;  // handed to flush() so far
  Status status_;       // the first write that failed
};

// A "files" entry: the path, or {"path": ..., "header_bytes": ...,
// "header_xxh3": "<16 hex digits>", "rows_xxh3": ...} when it has a check.
void append_file(JsonText& out, std::string_view path, std::string_view first_user,
                 const std::map<std::string, PlanFileCheck, std::less<>>& checks);
void append_buffer(JsonText& out, const PlanBuffer& buffer);
void append_row(JsonText& out, const PlanRow& row, PlanFiles& files);
// {"name":...,"memory_ids":[...],"tensors":[ then each name, then ]}.
void append_method_start(JsonText& out, const std::string& name,
                         std::span<const uint32_t> memory_ids);
void append_method_tensor(JsonText& out, const std::string& method, size_t index,
                          std::string_view tensor);
inline void append_method_end(JsonText& out) { out.raw("]}"); }

// Writes the plan file: the top-level members, `files` (with `checks`),
// `buffers`, then rows(emit) calling emit(const PlanRow&) for each tensor
// and returning a Status (not ok: nothing is written), then the methods,
// write_method(out, i, flush) writing method i (append_method_*) and
// calling flush() now and then in a long list. `files` must hold every
// path the rows name.
template <typename Rows, typename WriteMethod>
Status write_plan_text(const std::filesystem::path& path, bool allow_external_files,
                       uint32_t world_size, PlanFiles& files,
                       const std::map<std::string, PlanFileCheck, std::less<>>& checks,
                       std::span<const PlanBuffer> buffers, Rows rows, size_t methods,
                       WriteMethod write_method) {
  PlanSink sink(path);
  if (Status s = sink.open(); !s.ok()) return s;
  JsonText& out = sink.text();
  out.raw("{\n  \"format\": ");
  out.string(kPlanFormat, [] { return std::string("format"); });
  out.raw(",\n  \"version\": ");
  out.number(kPlanVersion);
  out.raw(",\n  \"allow_external_files\": ");
  out.raw(allow_external_files ? "true,\n" : "false,\n");
  if (world_size != 0) {
    out.raw("  \"world_size\": ");
    out.number(world_size);
    out.raw(",\n");
  }
  // "  \"key\": [\n    item,\n    item\n  ],"
  const auto open_array = [&](const char* key) {
    out.raw("  \"");
    out.raw(key);
    out.raw("\": [");
  };
  const auto next_item = [&](size_t i) {
    if (i != 0) sink.flush(false);
    out.raw(i == 0 ? "\n    " : ",\n    ");
  };
  const auto close_array = [&](size_t items, bool last) {
    out.raw(items == 0 ? "]" : "\n  ]");
    out.raw(last ? "\n" : ",\n");
  };
  open_array("files");
  for (size_t i = 0; i < files.paths().size(); ++i) {
    next_item(i);
    append_file(out, files.paths()[i], files.first_user(i), checks);
  }
  close_array(files.paths().size(), false);
  open_array("buffers");
  for (size_t i = 0; i < buffers.size(); ++i) {
    next_item(i);
    append_buffer(out, buffers[i]);
  }
  close_array(buffers.size(), false);
  open_array("tensors");
  size_t row = 0;
  // A failure here leaves the plan unwritten (the temporary file goes).
  if (Status s = rows([&](const PlanRow& r) {
        next_item(row++);
        append_row(out, r, files);
      });
      !s.ok()) {
    return s;
  }
  close_array(row, false);
  open_array("methods");
  const auto flush = [&] { sink.flush(false); };
  for (size_t i = 0; i < methods; ++i) {
    next_item(i);
    write_method(out, i, flush);
  }
  close_array(methods, true);
  out.raw("}\n");
  sink.flush(true);
  return sink.finish();
}

}  // namespace devalloc::detail
