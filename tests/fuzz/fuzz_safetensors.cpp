// A whole safetensors file (8-byte length, header, data) from the fuzz input.
#include <devalloc/core/safetensors.hpp>

#include "memory_file.hpp"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  devalloc::fuzz::MemoryFile file(data, size);
  auto opened = devalloc::SafetensorsFile::open(file.path());
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
