// How errors of a load name what they are about: the tensors of a copy
// step, its bytes in its buffer, the device it goes to.
#pragma once

#include "copy_schedule.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace devalloc::load {

// "a" or "a" .. "b": the tensors a step covers.
std::string tensors_text(const CopyStep& s);
// "bytes 0..4096 of buffer 3"
std::string range_text(const CopyStep& s);
// Bytes [offset, offset + nbytes) of step s as a step of their own, named
// by the tensors of `requests` that hold them (a step of many small
// tensors is cut into pieces; an error names the piece's tensors, not the
// whole run). Only for error texts: it scans every request.
CopyStep piece_of(const CopyStep& s, uint64_t offset, uint64_t nbytes,
                  const std::vector<CopyRequest>& requests);
// "copy of tensor "a" (bytes 0..4096 of buffer 3) to host:0 (...)"
std::string copy_text(const CopyStep& s, const ResolvedDevice& device);

}  // namespace devalloc::load
