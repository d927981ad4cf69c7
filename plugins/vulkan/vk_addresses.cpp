#include "vk_addresses.hpp"

#include <cinttypes>

namespace devalloc::vulkan {

using plugin::Failure;

ProcessAddresses* ProcessAddresses::acquire() {
  std::lock_guard lock(users_mutex_);
  // Counted only once it exists: a failed new leaves the count as it was.
  if (users_ == 0) current_ = new ProcessAddresses;
  ++users_;
  return current_;
}

void ProcessAddresses::release_user() noexcept {
  std::lock_guard lock(users_mutex_);
  if (--users_ == 0) {
    delete current_;
    current_ = nullptr;
  }
}

uint64_t ProcessAddresses::reserve_window(uint64_t nbytes) {
  // A guard window between two allocations: base + nbytes of one is never
  // the base of the next.
  const uint64_t size = plugin::align_up(nbytes, kWindowAlignment) + kWindowAlignment;
  std::lock_guard lock(mutex_);
  if (size < nbytes || next_window_ > UINT64_MAX - size) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                  plugin::format("no address window of %" PRIu64 " bytes is left", nbytes)};
  }
  const uint64_t window = next_window_;
  next_window_ += size;
  return window;
}

void ProcessAddresses::claim(const std::array<uint8_t, 16>& uuid, uint64_t address, uint64_t nbytes,
                             const std::string& call) {
  plugin::AllocationTable* table = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto& slot = tables_[uuid];
    if (!slot) slot = std::make_unique<plugin::AllocationTable>();
    table = slot.get();
  }
  try {
    table->adopt(
        address, nbytes, 1, [](uint64_t) {}, call);
  } catch (Failure& f) {
    f.message +=
        "; another instance's VkDevice may have an address space of its own: "
        "option address_model=window gives addresses unique in the process";
    throw;
  }
}

void ProcessAddresses::release(const std::array<uint8_t, 16>& uuid, uint64_t address) noexcept {
  plugin::AllocationTable* table = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = tables_.find(uuid);
    if (it == tables_.end()) return;
    table = it->second.get();
  }
  try {
    table->free(address, [](uint64_t) {});
  } catch (...) {
    // Not claimed: nothing to give back.
  }
}

}  // namespace devalloc::vulkan
