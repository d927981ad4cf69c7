#include "buffer_mappings.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace devalloc::load {

BufferMappings::~BufferMappings() {
  try {
    (void)unmap_all();
  } catch (...) {
    // Out of memory for a message: the mapping it was ending was taken
    // out first, so none is ended twice.
  }
}

Status BufferMappings::map(const DeviceCopyQueue& queue) {
  // The span of each buffer the queue's steps write.
  std::map<const DeviceBuffer*, std::pair<uint64_t, uint64_t>> spans;
  for (const CopyStep& s : queue.steps) {
    auto [it, fresh] = spans.try_emplace(s.buffer, s.buffer_offset, s.buffer_offset + s.nbytes);
    if (!fresh) {
      it->second.first = std::min(it->second.first, s.buffer_offset);
      it->second.second = std::max(it->second.second, s.buffer_offset + s.nbytes);
    }
  }
  const ResolvedDevice& device = queue.device;
  mappings_.reserve(mappings_.size() + spans.size());
  for (const auto& [buffer, span] : spans) {
    const uint64_t nbytes = span.second - span.first;
    Result<void*> host =
        device.plugin->map_to_host(device.device, buffer->address() + span.first, nbytes);
    if (!host.ok()) {
      return host.status().with_context(
          "mapping bytes " + std::to_string(span.first) + ".." + std::to_string(span.second) +
          " of buffer " + std::to_string(buffer->memory_id()) + " on " + device.describe() +
          " into the host ([load] direct = false reads through staging instead)");
    }
    mappings_.push_back(
        Mapping{&device, buffer, span.first, nbytes, static_cast<std::byte*>(*host)});
    mapping_of_[buffer] = mappings_.size() - 1;
  }
  return Status();
}

Status BufferMappings::unmap_all() {
  mapping_of_.clear();
  Status first;
  // Each mapping is taken out before it is ended: if a message cannot be
  // made (bad_alloc), no mapping is ended twice, and those left are ended
  // by the destructor's call.
  while (!mappings_.empty()) {
    const Mapping m = mappings_.back();
    mappings_.pop_back();
    Status s = m.device->plugin->unmap_from_host(m.device->device, m.host);
    if (!s.ok() && first.ok()) {
      first = s.with_context("unmapping bytes " + std::to_string(m.offset) + ".." +
                             std::to_string(m.offset + m.nbytes) + " of buffer " +
                             std::to_string(m.buffer->memory_id()) + " on " +
                             m.device->describe() + " (its bytes may not be on the device)");
    }
  }
  return first;
}

std::byte* BufferMappings::host_address(const DeviceBuffer* buffer, uint64_t buffer_offset) const {
  const Mapping& m = mappings_[mapping_of_.at(buffer)];
  return m.host + (buffer_offset - m.offset);
}

}  // namespace devalloc::load
