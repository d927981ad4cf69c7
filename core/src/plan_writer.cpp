#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "atomic_write.hpp"
#include "json_text.hpp"

#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace devalloc {

namespace {

// The plan as JSON text, written directly (json_text.hpp): one entry per
// line, so a plan stays readable and diffs stay small; tensors as rows, so
// that the text of a plan of many small tensors is not mostly keys.
using PlanText = detail::JsonText;

// The plan's source files, each once, in the order the tensors first name
// them: the "files" table the rows refer to by index.
class SourceFiles {
 public:
  explicit SourceFiles(const Plan& plan) {
    for (const PlanTensor& tensor : plan.tensors) {
      if (!tensor.source) continue;
      const size_t before = paths_.size();
      index_of(tensor.source->file);
      if (paths_.size() != before) first_users_.push_back(tensor.name);
    }
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

void append(PlanText& out, const PlanBuffer& buffer) {
  out.raw("{\"memory_id\":");
  out.number(buffer.memory_id);
  out.raw(",\"device\":");
  out.string(buffer.device,
             [&] { return "buffer " + std::to_string(buffer.memory_id) + " device"; });
  out.raw(",\"size\":");
  out.number(buffer.size);
  out.raw(",\"alignment\":");
  out.number(buffer.alignment);
  if (buffer.rank) {
    out.raw(",\"rank\":");
    out.number(*buffer.rank);
  }
  out.raw("}");
}

// A tensor as a row (version 2): [name, dtype, shape, memory_id, offset,
// source], the source null for scratch memory, the index of its file in
// "files" for a whole tensor of the same name, and an object otherwise.
void append(PlanText& out, const PlanTensor& tensor, SourceFiles& files) {
  const auto who = [&](const char* part) {
    return "tensor " + quote(tensor.name) + " " + part;
  };
  out.raw("[");
  out.string(tensor.name, [&] { return who("name"); });
  out.raw(",\"");
  out.raw(to_string(tensor.dtype));  // a dtype name needs no escape
  out.raw("\",");
  out.numbers(tensor.shape);
  out.raw(",");
  out.number(tensor.memory_id);
  out.raw(",");
  out.number(tensor.offset);
  out.raw(",");
  if (!tensor.source) {
    out.raw("null]");
    return;
  }
  const PlanSource& source = *tensor.source;
  const size_t file = files.index_of(source.file);
  if (source.key == tensor.name && !source.slice) {
    out.number(file);
    out.raw("]");
    return;
  }
  out.raw("{\"file\":");
  out.number(file);
  if (source.key != tensor.name) {
    out.raw(",\"key\":");
    out.string(source.key, [&] { return who("source key"); });
  }
  if (const std::optional<PlanSlice>& slice = source.slice) {
    out.raw(",\"dim\":");
    out.number(slice->dim);
    out.raw(",\"start\":");
    out.number(slice->start);
    out.raw(",\"length\":");
    out.number(slice->length);
  }
  out.raw("}]");
}

void append(PlanText& out, const PlanMethod& method) {
  const auto who = [&](const std::string& part) {
    return "method " + quote(method.name) + " " + part;
  };
  out.raw("{\"name\":");
  out.string(method.name, [&] { return who("name"); });
  out.raw(",\"memory_ids\":");
  out.numbers(method.memory_ids);
  out.raw(",\"tensors\":[");
  for (size_t i = 0; i < method.tensors.size(); ++i) {
    if (i != 0) out.raw(",");
    out.string(method.tensors[i], [&] { return who("tensor " + std::to_string(i)); });
  }
  out.raw("]}");
}

// The text goes to the file a chunk at a time: writing a plan takes a
// chunk of memory, not its whole text (16 MB for 100 000 tensors).
class PlanSink {
 public:
  static constexpr size_t kChunkBytes = 1 << 20;

  explicit PlanSink(const std::filesystem::path& path) : file_(path) {
    text_.text().reserve(kChunkBytes + (64 << 10));
  }
  Status open() { return file_.open(); }
  PlanText& text() { return text_; }

  // Hands the text to the file once a chunk is held (or, with `all`, what
  // is held). Past kMaxPlanBytes, or after a bad string, nothing more is
  // written: the plan will be refused, its length still counted.
  void flush(bool all) {
    if (!all && text_.text().size() < kChunkBytes) return;
    bytes_ += text_.text().size();
    if (status_.ok() && bytes_ <= kMaxPlanBytes && !text_.error()) {
      status_ = file_.write(std::as_bytes(std::span(text_.text())));
    }
    text_.text().clear();
  }

  // After flush(true): the first thing wrong, or the file renamed into
  // place. A plan read_plan would refuse is not written.
  Status finish(const std::filesystem::path& path) {
    if (text_.error()) {
      return Status(StatusCode::invalid_argument,
                    path_for_message(path.string()) + ": " + *text_.error());
    }
    if (bytes_ > kMaxPlanBytes) {
      return Status(StatusCode::invalid_argument,
                    path_for_message(path.string()) + ": not written: the plan is " +
                        std::to_string(bytes_) + " bytes, more than a plan file may be (" +
                        std::to_string(kMaxPlanBytes >> 20) + " MiB)");
    }
    if (!status_.ok()) return status_;
    return file_.commit();
  }

 private:
  PlanText text_;
  detail::AtomicFile file_;
  uint64_t bytes_ = 0;  // handed to flush() so far
  Status status_;       // the first write that failed
};

// "  \"key\": [\n    item,\n    item\n  ]," with each item written by
// append_item(i).
template <typename AppendItem>
void append_array(PlanSink& sink, const char* key, size_t items, bool last,
                  AppendItem append_item) {
  PlanText& out = sink.text();
  out.raw("  \"");
  out.raw(key);
  out.raw("\": [");
  for (size_t i = 0; i < items; ++i) {
    out.raw(i == 0 ? "\n    " : ",\n    ");
    append_item(i);
    sink.flush(false);
  }
  out.raw(items == 0 ? "]" : "\n  ]");
  out.raw(last ? "\n" : ",\n");
}

}  // namespace

static Status write_plan_or_throw(const Plan& plan, const std::filesystem::path& path) {
  PlanSink sink(path);
  if (Status s = sink.open(); !s.ok()) return s;
  PlanText& out = sink.text();
  out.raw("{\n  \"format\": ");
  out.string(kPlanFormat, [] { return std::string("format"); });
  out.raw(",\n  \"version\": ");
  out.number(kPlanVersion);
  out.raw(",\n  \"allow_external_files\": ");
  out.raw(plan.allow_external_files ? "true,\n" : "false,\n");
  if (plan.world_size != 0) {
    out.raw("  \"world_size\": ");
    out.number(plan.world_size);
    out.raw(",\n");
  }
  SourceFiles files(plan);
  append_array(sink, "files", files.paths().size(), false, [&](size_t i) {
    out.string(files.paths()[i],
               [&] { return "tensor " + quote(files.first_user(i)) + " source file"; });
  });
  append_array(sink, "buffers", plan.buffers.size(), false,
               [&](size_t i) { append(out, plan.buffers[i]); });
  append_array(sink, "tensors", plan.tensors.size(), false,
               [&](size_t i) { append(out, plan.tensors[i], files); });
  append_array(sink, "methods", plan.methods.size(), true,
               [&](size_t i) { append(out, plan.methods[i]); });
  out.raw("}\n");
  sink.flush(true);
  return sink.finish(path);
}

Status write_plan(const Plan& plan, const std::filesystem::path& path) {
  return detail::catch_as_status(
      [&] { return write_plan_or_throw(plan, path); },
      detail::file_failure(path, "writing the plan"));
}

}  // namespace devalloc
