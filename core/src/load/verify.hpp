// Verification of a load: every constant is read back through its plugin
// and its XXH3 hash compared with the hash of the source bytes.
#pragma once

#include "copy_schedule.hpp"
#include <devalloc/status.hpp>

#include <vector>

namespace devalloc {

// Reads back each request's bytes in bounded chunks (never more than
// chunk_bytes of host memory) and compares hashes. The first mismatch is an
// error naming the tensor, its buffer, device and plugin, and the file, and
// pointing at the tools that find the plugin's breach (the validation
// layer's source check, `devalloc conformance`).
// The hashes are compared with the files as they were opened (their
// offsets come from the header read then): a file modified in place since
// (MappedFile::check_unchanged, one fstat per file once every hash agreed,
// or for the file of a mismatch) fails the pass saying so, instead of
// passing or reporting a mismatch of the device.
Status verify_copies(const std::vector<CopyRequest>& requests,
                     uint64_t chunk_bytes);

}  // namespace devalloc
