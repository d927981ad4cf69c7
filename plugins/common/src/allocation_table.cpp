#include <devalloc/plugin_kit/allocation_table.hpp>

#include <cinttypes>

namespace devalloc::plugin {

uint64_t over_allocation(uint64_t nbytes, uint64_t alignment, uint64_t natural) {
  const uint64_t slack = alignment > natural ? alignment - natural : 0;
  if (nbytes > UINT64_MAX - slack) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                  format("%" PRIu64 " bytes aligned to %" PRIu64
                         " exceed any device's address space (PLUGIN-11)",
                         nbytes, alignment)};
  }
  return nbytes + slack;
}

bool AllocationTable::contains(uint64_t address, uint64_t nbytes) const noexcept {
  std::lock_guard lock(mutex_);
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) return false;
  --it;
  const uint64_t offset = address - it->first;
  return offset <= it->second.nbytes && nbytes <= it->second.nbytes - offset;
}

void AllocationTable::require_range(uint64_t address, uint64_t nbytes, const char* role) const {
  if (contains(address, nbytes)) return;
  throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                format("%s [0x%" PRIx64 ", +%" PRIu64
                       ") is not inside a live allocation of this device (PLUGIN-15)",
                       role, address, nbytes)};
}

std::optional<Failure> AllocationTable::overlap(uint64_t address, uint64_t nbytes,
                                                const std::string& call) const {
  // Live entries never overlap one another: only the last one that starts
  // before the new range ends can reach into it.
  const uint64_t end = nbytes > UINT64_MAX - address ? UINT64_MAX : address + nbytes;
  auto it = live_.lower_bound(end);
  if (it == live_.begin()) return std::nullopt;
  --it;
  if (it->first + it->second.nbytes <= address && it->first != address) return std::nullopt;
  return Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                 format("%s returned 0x%" PRIx64 " (%" PRIu64
                        " bytes), which overlaps the live allocation [0x%" PRIx64 ", +%" PRIu64
                        ") it gave before (memory handed out twice; a free that reported a "
                        "failure may have freed it): not handed out again (PLUGIN-12)",
                        call.empty() ? "the runtime" : call.c_str(), address, nbytes, it->first,
                        it->second.nbytes)};
}

AllocationTable::Allocation AllocationTable::claim(uint64_t address) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(address);
  if (it == live_.end() || it->second.freeing) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  format("0x%" PRIx64 " is not %s", address, live_name_)};
  }
  it->second.freeing = true;
  return Allocation{address, it->second.nbytes, it->second.base};
}

void AllocationTable::unclaim(uint64_t address) noexcept {
  std::lock_guard lock(mutex_);
  if (auto it = live_.find(address); it != live_.end()) it->second.freeing = false;
}

void AllocationTable::erase(uint64_t address) noexcept {
  std::lock_guard lock(mutex_);
  if (auto it = live_.find(address); it != live_.end()) {
    live_bytes_ -= it->second.nbytes;
    live_.erase(it);
  }
}

void AllocationTable::clear() noexcept {
  std::lock_guard lock(mutex_);
  live_.clear();
  live_bytes_ = 0;
}

size_t AllocationTable::size() const noexcept {
  std::lock_guard lock(mutex_);
  return live_.size();
}

uint64_t AllocationTable::live_bytes() const noexcept {
  std::lock_guard lock(mutex_);
  return live_bytes_;
}

}  // namespace devalloc::plugin
