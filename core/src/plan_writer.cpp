#include <devalloc/core/plan.hpp>
#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "atomic_write.hpp"
#include "json_text.hpp"

namespace devalloc {

namespace {

// The plan as JSON text, written directly (json_text.hpp): compact objects,
// one per line, so a plan stays readable and diffs stay small.
using PlanText = detail::JsonText;

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

void append(PlanText& out, const PlanTensor& tensor) {
  const auto who = [&](const char* part) {
    return "tensor " + quote(tensor.name) + " " + part;
  };
  out.raw("{\"name\":");
  out.string(tensor.name, [&] { return who("name"); });
  out.raw(",\"dtype\":");
  out.string(to_string(tensor.dtype), [&] { return who("dtype"); });
  out.raw(",\"shape\":");
  out.numbers(tensor.shape);
  out.raw(",\"memory_id\":");
  out.number(tensor.memory_id);
  out.raw(",\"offset\":");
  out.number(tensor.offset);
  out.raw(",\"source\":");
  if (!tensor.source) {
    out.raw("null}");
    return;
  }
  out.raw("{\"file\":");
  out.string(tensor.source->file, [&] { return who("source file"); });
  out.raw(",\"key\":");
  out.string(tensor.source->key, [&] { return who("source key"); });
  if (const std::optional<PlanSlice>& slice = tensor.source->slice) {
    out.raw(",\"dim\":");
    out.number(slice->dim);
    out.raw(",\"start\":");
    out.number(slice->start);
    out.raw(",\"length\":");
    out.number(slice->length);
  }
  out.raw("}}");
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

template <class T>
void append_array(PlanText& out, const char* key, const std::vector<T>& items, bool last) {
  out.raw("  \"");
  out.raw(key);
  out.raw("\": [");
  for (size_t i = 0; i < items.size(); ++i) {
    out.raw(i == 0 ? "\n    " : ",\n    ");
    append(out, items[i]);
  }
  out.raw(items.empty() ? "]" : "\n  ]");
  out.raw(last ? "\n" : ",\n");
}

}  // namespace

static Status write_plan_or_throw(const Plan& plan, const std::filesystem::path& path) {
  PlanText out;
  // About what a tensor's line takes with a short name, so that a plan of
  // 100 000 tensors is not copied each time the text doubles.
  reserve_on_huge_pages(out.text(), 256 + 64 * plan.buffers.size() + 192 * plan.tensors.size());
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
  append_array(out, "buffers", plan.buffers, false);
  append_array(out, "tensors", plan.tensors, false);
  append_array(out, "methods", plan.methods, true);
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
