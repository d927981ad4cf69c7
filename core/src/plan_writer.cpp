#include <devalloc/core/plan.hpp>

#include "atomic_write.hpp"

#include <nlohmann/json.hpp>

namespace devalloc {

namespace {

using nlohmann::ordered_json;

ordered_json to_json(const PlanBuffer& buffer) {
  return {{"memory_id", buffer.memory_id},
          {"device", buffer.device},
          {"size", buffer.size},
          {"alignment", buffer.alignment}};
}

ordered_json to_json(const PlanTensor& tensor) {
  ordered_json source = nullptr;
  if (tensor.source) source = {{"file", tensor.source->file}, {"key", tensor.source->key}};
  return {{"name", tensor.name},
          {"dtype", to_string(tensor.dtype)},
          {"shape", tensor.shape},
          {"memory_id", tensor.memory_id},
          {"offset", tensor.offset},
          {"source", source}};
}

ordered_json to_json(const PlanMethod& method) {
  return {{"name", method.name},
          {"memory_ids", method.memory_ids},
          {"tensors", method.tensors}};
}

// One element per line: a plan stays readable and diffs stay small, where
// a fully indented dump would spread each shape over several lines.
template <class T>
void append_array(std::string& text, const char* key, const std::vector<T>& items,
                  bool last) {
  text += "  \"";
  text += key;
  text += "\": [";
  for (size_t i = 0; i < items.size(); ++i) {
    text += i == 0 ? "\n    " : ",\n    ";
    text += to_json(items[i]).dump();
  }
  text += items.empty() ? "]" : "\n  ]";
  text += last ? "\n" : ",\n";
}

}  // namespace

Status write_plan(const Plan& plan, const std::filesystem::path& path) {
  std::string text = "{\n";
  text += "  \"format\": " + ordered_json(kPlanFormat).dump() + ",\n";
  text += "  \"version\": " + std::to_string(kPlanVersion) + ",\n";
  text += "  \"allow_external_files\": ";
  text += plan.allow_external_files ? "true,\n" : "false,\n";
  try {
    append_array(text, "buffers", plan.buffers, false);
    append_array(text, "tensors", plan.tensors, false);
    append_array(text, "methods", plan.methods, true);
  } catch (const nlohmann::json::type_error& error) {
    return Status(StatusCode::invalid_argument,
                  path.string() + ": a name is not valid UTF-8: " + error.what());
  }
  text += "}\n";
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(text))};
  return detail::write_file_atomically(path, parts);
}

}  // namespace devalloc
