#include "cl_buffers.hpp"

#include <atomic>
#include <cinttypes>
#include <devalloc/plugin_kit/allocation_table.hpp>

namespace devalloc::opencl {

namespace {
std::atomic<uint64_t> next_window{kFirstWindow};
}  // namespace

uint64_t reserve_window(uint64_t nbytes, uint64_t alignment) {
  uint64_t next = next_window.load();
  for (;;) {
    const uint64_t start = plugin::align_up(next, alignment);
    // The end of the window and its gap, unless that wraps past 2^64.
    const bool fits =
        start >= next && nbytes <= UINT64_MAX - start && kWindowGap <= UINT64_MAX - start - nbytes;
    if (!fits) {
      throw plugin::Failure{
          DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
          plugin::format("no address window of %" PRIu64 " bytes aligned to %" PRIu64
                         " is left: this process has used up the plugin's device address "
                         "range above 0x%" PRIx64,
                         nbytes, alignment, kFirstWindow)};
    }
    if (next_window.compare_exchange_weak(next, start + nbytes + kWindowGap)) return start;
  }
}

HeldRange::~HeldRange() {
  if (buffer_ != nullptr) cl_->clReleaseMemObject(buffer_);
}

void BufferTable::add(uint64_t address, uint64_t nbytes, cl_mem buffer) {
  std::lock_guard lock(mutex_);
  live_.emplace(address, Entry{nbytes, buffer, false});
}

HeldRange BufferTable::find(uint64_t address, uint64_t nbytes, uint32_t index, const char* role,
                            const char* rule) const {
  {
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound(address);
    if (it != live_.begin()) {
      --it;
      const uint64_t offset = address - it->first;
      const Entry& entry = it->second;
      if (!entry.freeing && offset <= entry.nbytes && nbytes <= entry.nbytes - offset) {
        // Under the lock: a free that claims the entry after this returns
        // releases its reference only, not the buffer under this one.
        const cl_int retained = cl_.clRetainMemObject(entry.buffer);
        cl_.check(retained, plugin::CallKind::work, "clRetainMemObject(buffer at 0x%" PRIx64 ")",
                  it->first);
        return HeldRange(cl_, entry.buffer, offset, it->first);
      }
    }
  }
  throw plugin::Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                        plugin::format("%s [0x%" PRIx64 ", +%" PRIu64
                                       ") is not inside one live allocation of device %u (%s)",
                                       role, address, nbytes, index, rule)};
}

cl_mem BufferTable::claim(uint64_t address, uint32_t index) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(address);
  if (it == live_.end() || it->second.freeing) {
    throw plugin::Failure{
        DEVALLOC_STATUS_INVALID_ARGUMENT,
        plugin::format("0x%" PRIx64 " is not a live allocation of device %u (PLUGIN-12)", address,
                       index)};
  }
  it->second.freeing = true;
  return it->second.buffer;
}

void BufferTable::unclaim(uint64_t address) noexcept {
  std::lock_guard lock(mutex_);
  if (auto it = live_.find(address); it != live_.end()) it->second.freeing = false;
}

void BufferTable::erase(uint64_t address) noexcept {
  std::lock_guard lock(mutex_);
  live_.erase(address);
}

void BufferTable::clear() noexcept {
  std::lock_guard lock(mutex_);
  live_.clear();
}

}  // namespace devalloc::opencl
