#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>

#include "atomic_write.hpp"

#include <optional>

namespace devalloc {

namespace {

// Writes the plan's JSON text straight into one string: a plan of 100 000
// tensors is not first built as a JSON document. Compact objects, one per
// line (a plan stays readable and diffs stay small), strings escaped as
// JSON requires (quote, backslash, control characters) and otherwise kept
// as UTF-8, which the writer checks.
class PlanText {
 public:
  // Why the plan cannot be written ("tensor \"w\xff\": name is not valid
  // UTF-8 at byte 1"), once the first bad string was met.
  const std::optional<std::string>& error() const { return error_; }
  std::string& text() { return text_; }

  void raw(std::string_view s) { text_ += s; }
  void number(uint64_t n) { text_ += std::to_string(n); }

  // `what` names the string in the error: "tensor \"w\" key".
  template <typename What>
  void string(std::string_view s, What what) {
    if (const std::optional<size_t> bad = invalid_utf8_offset(s); bad && !error_) {
      error_ = what() + " is not valid UTF-8 at byte " + std::to_string(*bad);
    }
    static const char kHex[] = "0123456789abcdef";
    text_ += '"';
    for (const char c : s) {
      const auto byte = static_cast<unsigned char>(c);
      switch (c) {
        case '"': text_ += "\\\""; break;
        case '\\': text_ += "\\\\"; break;
        case '\b': text_ += "\\b"; break;
        case '\f': text_ += "\\f"; break;
        case '\n': text_ += "\\n"; break;
        case '\r': text_ += "\\r"; break;
        case '\t': text_ += "\\t"; break;
        default:
          if (byte < 0x20) {
            text_ += "\\u00";
            text_ += kHex[byte >> 4];
            text_ += kHex[byte & 0xf];
          } else {
            text_ += c;
          }
      }
    }
    text_ += '"';
  }

  template <typename T>
  void numbers(const std::vector<T>& values) {
    text_ += '[';
    for (size_t i = 0; i < values.size(); ++i) {
      if (i != 0) text_ += ',';
      number(values[i]);
    }
    text_ += ']';
  }

 private:
  std::string text_;
  std::optional<std::string> error_;
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

Status write_plan(const Plan& plan, const std::filesystem::path& path) {
  PlanText out;
  out.raw("{\n  \"format\": ");
  out.string(kPlanFormat, [] { return std::string("format"); });
  out.raw(",\n  \"version\": ");
  out.number(kPlanVersion);
  out.raw(",\n  \"allow_external_files\": ");
  out.raw(plan.allow_external_files ? "true,\n" : "false,\n");
  append_array(out, "buffers", plan.buffers, false);
  append_array(out, "tensors", plan.tensors, false);
  append_array(out, "methods", plan.methods, true);
  out.raw("}\n");
  if (out.error()) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(path.string()) + ": " + *out.error());
  }
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(out.text()))};
  return detail::write_file_atomically(path, parts);
}

}  // namespace devalloc
