#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "plan_text.hpp"

#include <span>
#include <string>

namespace devalloc {

namespace detail {

void PlanSink::flush(bool all) {
  if (!all && text_.text().size() < kChunkBytes) return;
  bytes_ += text_.text().size();
  if (status_.ok() && bytes_ <= kMaxPlanBytes && !text_.error()) {
    status_ = file_.write(std::as_bytes(std::span(text_.text())));
  }
  text_.text().clear();
}

Status PlanSink::finish() {
  if (text_.error()) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(path_.string()) + ": " + *text_.error());
  }
  if (bytes_ > kMaxPlanBytes) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(path_.string()) + ": not written: the plan is " +
                      std::to_string(bytes_) + " bytes, more than a plan file may be (" +
                      std::to_string(kMaxPlanBytes >> 20) + " MiB)");
  }
  if (!status_.ok()) return status_;
  return file_.commit();
}

void append_file(JsonText& out, std::string_view path, std::string_view first_user,
                 const std::map<std::string, PlanFileCheck, std::less<>>& checks) {
  const auto who = [&] { return "tensor " + quote(first_user) + " source file"; };
  const auto found = checks.find(path);
  if (found == checks.end()) {
    out.string(path, who);
    return;
  }
  const auto hex = [&](uint64_t value) {
    static constexpr char kDigits[] = "0123456789abcdef";
    char digits[18] = {'"'};
    for (int i = 0; i < 16; ++i) digits[16 - i] = kDigits[(value >> (4 * i)) & 0xf];
    digits[17] = '"';
    out.raw(std::string_view(digits, sizeof digits));
  };
  out.raw("{\"path\":");
  out.string(path, who);
  out.raw(",\"header_bytes\":");
  out.number(found->second.header_bytes);
  out.raw(",\"header_xxh3\":");
  hex(found->second.header_xxh3);
  out.raw(",\"rows_xxh3\":");
  hex(found->second.rows_xxh3);
  out.raw("}");
}

void append_buffer(JsonText& out, const PlanBuffer& buffer) {
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

// The source null for scratch memory, the index of its file in "files" for
// a whole tensor of the row's name, and an object otherwise.
void append_row(JsonText& out, const PlanRow& row, PlanFiles& files) {
  const auto who = [&](const char* part) { return "tensor " + quote(row.name) + " " + part; };
  out.raw("[");
  out.string(row.name, [&] { return who("name"); });
  out.raw(",\"");
  out.raw(to_string(row.dtype));  // a dtype name needs no escape
  out.raw("\",");
  out.raw("[");
  for (size_t i = 0; i < row.shape.size(); ++i) {
    if (i != 0) out.raw(",");
    out.number(row.shape[i]);
  }
  out.raw("],");
  out.number(row.memory_id);
  out.raw(",");
  out.number(row.offset);
  out.raw(",");
  if (!row.source) {
    out.raw("null]");
    return;
  }
  const PlanRowSource& source = *row.source;
  const size_t file = files.index_of(source.file);
  if (source.key == row.name && !source.slice) {
    out.number(file);
    out.raw("]");
    return;
  }
  out.raw("{\"file\":");
  out.number(file);
  if (source.key != row.name) {
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

void append_method_start(JsonText& out, const std::string& name,
                         std::span<const uint32_t> memory_ids) {
  out.raw("{\"name\":");
  out.string(name, [&] { return "method " + quote(name) + " name"; });
  out.raw(",\"memory_ids\":[");
  for (size_t i = 0; i < memory_ids.size(); ++i) {
    if (i != 0) out.raw(",");
    out.number(memory_ids[i]);
  }
  out.raw("],\"tensors\":[");
}

void append_method_tensor(JsonText& out, const std::string& method, size_t index,
                          std::string_view tensor) {
  if (index != 0) out.raw(",");
  out.string(tensor,
             [&] { return "method " + quote(method) + " tensor " + std::to_string(index); });
}

}  // namespace detail

namespace {

detail::PlanRow row_of(const PlanTensor& tensor) {
  detail::PlanRow row{tensor.name, tensor.dtype, tensor.shape, tensor.memory_id, tensor.offset,
                      std::nullopt};
  if (tensor.source) {
    row.source = detail::PlanRowSource{tensor.source->file, tensor.source->key,
                                       tensor.source->slice};
  }
  return row;
}

}  // namespace

static Status write_plan_or_throw(const Plan& plan, const std::filesystem::path& path) {
  detail::PlanFiles files;
  for (const PlanTensor& tensor : plan.tensors) {
    if (tensor.source) files.add(tensor.source->file, tensor.name);
  }
  return detail::write_plan_text(
      path, plan.allow_external_files, plan.world_size, files, plan.file_checks, plan.buffers,
      [&](const auto& emit) {
        for (const PlanTensor& tensor : plan.tensors) emit(row_of(tensor));
        return Status();
      },
      plan.methods.size(),
      [&](detail::JsonText& out, size_t i, const auto& flush) {
        const PlanMethod& method = plan.methods[i];
        detail::append_method_start(out, method.name, method.memory_ids);
        for (size_t k = 0; k < method.tensors.size(); ++k) {
          detail::append_method_tensor(out, method.name, k, method.tensors[k]);
          if (k % 4096 == 4095) flush();
        }
        detail::append_method_end(out);
      });
}

Status write_plan(const Plan& plan, const std::filesystem::path& path) {
  return detail::catch_as_status(
      [&] { return write_plan_or_throw(plan, path); },
      detail::file_failure(path, "writing the plan"));
}

}  // namespace devalloc
