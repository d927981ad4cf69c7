#include "copy_texts.hpp"

#include <devalloc/input_text.hpp>

#include <algorithm>

namespace devalloc::load {

std::string tensors_text(const CopyStep& s) {
  if (s.first_tensor == s.last_tensor) return quote(s.first_tensor);
  return quote(s.first_tensor) + " .. " + quote(s.last_tensor);
}

std::string range_text(const CopyStep& s) {
  return "bytes " + std::to_string(s.buffer_offset) + ".." +
         std::to_string(s.buffer_offset + s.nbytes) + " of buffer " +
         std::to_string(s.buffer->memory_id());
}

CopyStep piece_of(const CopyStep& s, uint64_t offset, uint64_t nbytes,
                  const std::vector<CopyRequest>& requests) {
  CopyStep piece = s;
  piece.buffer_offset += offset;
  piece.nbytes = nbytes;
  // A strided step is one request: its tensor already.
  if (s.run_bytes != 0) return piece;
  piece.file_offset += offset;
  const uint64_t begin = piece.file_offset;
  const uint64_t end = begin + std::max<uint64_t>(nbytes, 1);
  const CopyRequest* first = nullptr;
  const CopyRequest* last = nullptr;
  for (const CopyRequest& r : requests) {
    if (r.file.get() != s.file || r.buffer.get() != s.buffer || r.nbytes == 0 ||
        r.file_offset >= end || r.file_offset + r.nbytes <= begin) {
      continue;
    }
    if (first == nullptr || r.file_offset < first->file_offset) first = &r;
    if (last == nullptr || r.file_offset > last->file_offset) last = &r;
  }
  if (first != nullptr) {
    piece.first_tensor = first->tensor;
    piece.last_tensor = last->tensor;
  }
  return piece;
}

std::string copy_text(const CopyStep& s, const ResolvedDevice& device) {
  return "copy of tensor " + tensors_text(s) + " (" + range_text(s) + ") to " +
         device.describe();
}

}  // namespace devalloc::load
