// A whole safetensors file (8-byte length, header, data) from the fuzz input.
#include <devalloc/core/safetensors.hpp>

#include "memory_file.hpp"

#include <cstdlib>
#include <memory>
#include <string>

namespace {

// The fast header reader may take a header or leave it to the strict one,
// but what open() returns must be what the strict reader alone returns.
using Opened = devalloc::Result<std::shared_ptr<const devalloc::SafetensorsFile>>;

void check_same_as_strict(const Opened& opened, const std::string& path) {
  auto strict = devalloc::SafetensorsFile::open(path, devalloc::detail::HeaderReading::strict);
  if (opened.ok() != strict.ok()) std::abort();
  if (!opened.ok()) {
    if (opened.status().message() != strict.status().message()) std::abort();
    return;
  }
  const auto& a = (*opened)->tensors();
  const auto& b = (*strict)->tensors();
  if (a.size() != b.size() || (*opened)->metadata() != (*strict)->metadata()) std::abort();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape ||
        a[i].offset != b[i].offset || a[i].nbytes != b[i].nbytes) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  devalloc::fuzz::MemoryFile file(data, size);
  auto opened = devalloc::SafetensorsFile::open(file.path());
  check_same_as_strict(opened, file.path());
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
