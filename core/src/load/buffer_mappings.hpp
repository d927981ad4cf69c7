// The host mappings of a load's HOST_MAPPABLE devices (ABI 1.2,
// PLUGIN-22): the span of each buffer a queue's steps write is mapped for
// the load, read into directly, and unmapped before the device is
// synchronized.
#pragma once

#include "copy_schedule.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace devalloc::load {

class BufferMappings {
 public:
  BufferMappings() = default;
  BufferMappings(const BufferMappings&) = delete;
  BufferMappings& operator=(const BufferMappings&) = delete;
  // Ends the mappings left (a load that failed before unmap_all).
  ~BufferMappings();

  // Maps the span of each buffer that the queue's steps cover; on failure
  // the mappings made so far stay, for unmap_all.
  Status map(const DeviceCopyQueue& queue);
  // Ends every mapping made, once, and returns the first failure: until it
  // returned, the writes need not be on the device.
  Status unmap_all();
  // Where byte buffer_offset of a mapped buffer is in the host.
  std::byte* host_address(const DeviceBuffer* buffer, uint64_t buffer_offset) const;

 private:
  struct Mapping {
    const ResolvedDevice* device = nullptr;
    const DeviceBuffer* buffer = nullptr;
    uint64_t offset = 0;  // of the span in the buffer
    uint64_t nbytes = 0;
    std::byte* host = nullptr;
  };
  std::vector<Mapping> mappings_;
  std::map<const DeviceBuffer*, size_t> mapping_of_;  // index into mappings_
};

}  // namespace devalloc::load
