#include <devalloc/core/plan.hpp>
#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "atomic_write.hpp"
#include "json_text.hpp"

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

// "  \"key\": [\n    item,\n    item\n  ]," with each item written by
// append_item(i).
template <typename AppendItem>
void append_array(PlanText& out, const char* key, size_t items, bool last,
                  AppendItem append_item) {
  out.raw("  \"");
  out.raw(key);
  out.raw("\": [");
  for (size_t i = 0; i < items; ++i) {
    out.raw(i == 0 ? "\n    " : ",\n    ");
    append_item(i);
  }
  out.raw(items == 0 ? "]" : "\n  ]");
  out.raw(last ? "\n" : ",\n");
}

}  // namespace

static Status write_plan_or_throw(const Plan& plan, const std::filesystem::path& path) {
  PlanText out;
  // About the length of the text, so that a plan of 100 000 tensors is not
  // copied each time the text doubles: a row is its name and about 40
  // bytes more, and a method lists the names again.
  size_t estimate = 256 + 64 * plan.buffers.size();
  for (const PlanTensor& tensor : plan.tensors) {
    estimate += 2 * tensor.name.size() + 44 + 8 * tensor.shape.size();
  }
  reserve_on_huge_pages(out.text(), estimate);
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
  append_array(out, "files", files.paths().size(), false, [&](size_t i) {
    out.string(files.paths()[i],
               [&] { return "tensor " + quote(files.first_user(i)) + " source file"; });
  });
  append_array(out, "buffers", plan.buffers.size(), false,
               [&](size_t i) { append(out, plan.buffers[i]); });
  append_array(out, "tensors", plan.tensors.size(), false,
               [&](size_t i) { append(out, plan.tensors[i], files); });
  append_array(out, "methods", plan.methods.size(), true,
               [&](size_t i) { append(out, plan.methods[i]); });
  out.raw("}\n");
  if (out.error()) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(path.string()) + ": " + *out.error());
  }
  // A plan read_plan would refuse is not written.
  if (out.text().size() > kMaxPlanBytes) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(path.string()) + ": not written: the plan is " +
                      std::to_string(out.text().size()) + " bytes, more than a plan file may "
                      "be (" + std::to_string(kMaxPlanBytes >> 20) + " MiB)");
  }
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(out.text()))};
  return detail::write_file_atomically(path, parts);
}

Status write_plan(const Plan& plan, const std::filesystem::path& path) {
  return detail::catch_as_status(
      [&] { return write_plan_or_throw(plan, path); },
      detail::file_failure(path, "writing the plan"));
}

}  // namespace devalloc
