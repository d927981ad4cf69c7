// A whole safetensors file (8-byte length, header, data) from the fuzz input.
// nlohmann's parser reads the same header as the oracle: a header that is
// not JSON to it is refused, and an accepted one says what it says to it.
#include <devalloc/core/safetensors.hpp>

#include <nlohmann/json.hpp>

#include "memory_file.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

namespace {

using Opened = devalloc::Result<std::shared_ptr<const devalloc::SafetensorsFile>>;

void check_against_oracle(const Opened& opened, const uint8_t* data, size_t size) {
  if (size < 8) return;
  uint64_t length = 0;
  std::memcpy(&length, data, 8);  // the fuzz machines are little-endian
  if (length > size - 8) return;   // refused before the header is read
  const std::string text(reinterpret_cast<const char*>(data) + 8, static_cast<size_t>(length));
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    if (opened.ok()) std::abort();  // taken what is not JSON
    return;
  }
  if (!opened.ok()) return;
  const devalloc::SafetensorsFile& file = **opened;
  std::map<std::string, std::string> metadata;
  size_t entries = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_null()) metadata = entry.get<std::map<std::string, std::string>>();
      continue;
    }
    ++entries;
    const devalloc::SafetensorsTensor* tensor = file.find(name);
    if (tensor == nullptr) std::abort();
    const auto& offsets = entry.at("data_offsets");
    if (devalloc::to_string(tensor->dtype) != entry.at("dtype").get<std::string>() ||
        tensor->shape != entry.at("shape").get<std::vector<uint64_t>>() ||
        tensor->offset != file.data_offset() + offsets.at(0).get<uint64_t>() ||
        tensor->nbytes != offsets.at(1).get<uint64_t>() - offsets.at(0).get<uint64_t>()) {
      std::abort();
    }
  }
  // nlohmann keeps the last of a key given twice: a count that differs is
  // a name the reader took twice.
  if (entries != file.tensors().size() || metadata != file.metadata()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  devalloc::fuzz::MemoryFile file(data, size);
  auto opened = devalloc::SafetensorsFile::open(file.path());
  check_against_oracle(opened, data, size);
  if (!opened.ok()) {
    devalloc::fuzz::check_names_file(opened.status().message(), file.path());
    return 0;
  }
  // An accepted file's tensors lie inside it and tile its data section.
  uint64_t expected = (*opened)->data_offset();
  for (const devalloc::SafetensorsTensor& tensor : (*opened)->tensors()) {
    if (tensor.offset != expected) std::abort();
    const auto bytes = (*opened)->bytes(tensor);
    if (bytes.size() != tensor.nbytes) std::abort();
    if (!bytes.empty()) {
      volatile std::byte last = bytes.back();
      (void)last;
    }
    expected += tensor.nbytes;
  }
  if (expected != size) std::abort();
  return 0;
}
