#include <devalloc/core/safetensors.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "atomic_write.hpp"
#include "json_text.hpp"

#include <set>

namespace devalloc {

static Status write_safetensors_or_throw(const std::filesystem::path& path,
                                         std::span<const SafetensorsWriteTensor> tensors,
                                         const std::map<std::string, std::string>& metadata) {
  const auto fail = [&](const std::string& reason) {
    return Status(StatusCode::invalid_argument, path_for_message(path.string()) + ": " + reason);
  };
  // The header in data order, which is how people read it, written as text
  // (json_text.hpp): a header of 100 000 tensors is not a JSON document
  // whose ordered object looks every name up one by one.
  detail::JsonText header;
  header.raw("{");
  if (!metadata.empty()) {
    header.raw("\"__metadata__\":{");
    bool first = true;
    for (const auto& entry : metadata) {
      // Named, not bound: clang 14 lets no lambda capture a structured binding.
      const std::string& key = entry.first;
      const std::string& value = entry.second;
      header.raw(first ? "" : ",");
      first = false;
      header.string(key, [&] { return "__metadata__ key " + quote(key); });
      header.raw(":");
      header.string(value, [&] { return "__metadata__ " + quote(key) + " value"; });
    }
    header.raw("}");
  }

  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const SafetensorsWriteTensor& tensor : tensors) {
    const std::string name = "tensor " + quote(tensor.name) + ": ";
    if (tensor.name == "__metadata__") return fail(name + "the name is reserved");
    if (!names.insert(tensor.name).second) return fail(name + "given twice");
    Result<uint64_t> nbytes = byte_size(tensor.dtype, tensor.shape);
    if (!nbytes.ok()) return fail(name + nbytes.status().message());
    if (*nbytes != tensor.bytes.size()) {
      return fail(name + "shape " + shape_to_string(tensor.shape) + " of " +
                  std::string(to_string(tensor.dtype)) + " needs " +
                  std::to_string(*nbytes) + " bytes, " +
                  std::to_string(tensor.bytes.size()) + " given");
    }
    header.raw(header.text().size() == 1 ? "" : ",");
    header.string(tensor.name, [&] { return "tensor " + quote(tensor.name) + " name"; });
    header.raw(":{\"dtype\":\"");
    header.raw(to_string(tensor.dtype));
    header.raw("\",\"shape\":");
    header.numbers(tensor.shape);
    header.raw(",\"data_offsets\":[");
    header.number(offset);
    header.raw(",");
    header.number(offset + *nbytes);
    header.raw("]}");
    offset += *nbytes;
  }
  header.raw("}");
  if (header.error()) return fail(*header.error());
  std::string& text = header.text();
  // Spaces are JSON whitespace: the data then starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxSafetensorsHeaderBytes) {
    return fail("header of " + std::to_string(text.size()) + " bytes is above the limit of " +
                std::to_string(kMaxSafetensorsHeaderBytes));
  }

  std::byte length[8];
  for (size_t i = 0; i < 8; ++i) {
    length[i] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xff);
  }
  std::vector<std::span<const std::byte>> parts;
  parts.reserve(tensors.size() + 2);
  parts.emplace_back(length, sizeof length);
  parts.push_back(std::as_bytes(std::span(text)));
  for (const SafetensorsWriteTensor& tensor : tensors) parts.push_back(tensor.bytes);
  return detail::write_file_atomically(path, parts);
}

Status write_safetensors(const std::filesystem::path& path,
                         std::span<const SafetensorsWriteTensor> tensors,
                         const std::map<std::string, std::string>& metadata) {
  return detail::catch_as_status([&] { return write_safetensors_or_throw(path, tensors, metadata); },
                                 detail::file_failure(path, "writing"));
}

}  // namespace devalloc
