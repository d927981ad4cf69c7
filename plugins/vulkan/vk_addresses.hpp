// Every device address this process's instances hand out, per physical
// device (by its deviceUUID). PLUGIN-12 asks that two instances never hand
// out one address on one device, and each VkDevice of a discrete GPU may
// have an address space of its own, so buffer device addresses of two
// instances can coincide: each is claimed here, and one that another live
// allocation holds is refused. The window model never collides: its
// windows come from one counter per process.
#pragma once

#include <array>
#include <cstdint>
#include <devalloc/plugin_kit/allocation_table.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace devalloc::vulkan {

// Windows of the window address model start here, aligned to this.
inline constexpr uint64_t kFirstWindow = uint64_t{1} << 44;
inline constexpr uint64_t kWindowAlignment = uint64_t{64} << 10;

// Shared by the VulkanDevices alive (through ProcessAddressesShare),
// counted, and freed with the last one: never a static object, whose
// destruction at exit could come before that of an instance a host
// destroys from a static destructor of its own.
class ProcessAddresses {
 public:
  static ProcessAddresses* acquire();
  static void release_user() noexcept;

  // A window of at least nbytes, aligned to kWindowAlignment, never handed
  // out before while this registry lives. Throws OUT_OF_DEVICE_MEMORY when
  // the range is used up.
  uint64_t reserve_window(uint64_t nbytes);
  // Records [address, +nbytes) for the device; throws Failure
  // (DEVICE_ERROR, PLUGIN-12) naming `call` when another live allocation
  // of the device in this process holds part of it.
  void claim(const std::array<uint8_t, 16>& uuid, uint64_t address, uint64_t nbytes,
             const std::string& call);
  // Forgets what claim() recorded at address; nothing if it was not.
  void release(const std::array<uint8_t, 16>& uuid, uint64_t address) noexcept;

 private:
  std::mutex mutex_;
  uint64_t next_window_ = kFirstWindow;
  std::map<std::array<uint8_t, 16>, std::unique_ptr<plugin::AllocationTable>> tables_;

  // Trivially destructible: usable at any time of the process.
  static inline std::mutex users_mutex_;
  static inline ProcessAddresses* current_ = nullptr;
  static inline uint64_t users_ = 0;
};

// A device's share of the registry: it lives while any device holds one.
class ProcessAddressesShare {
 public:
  ProcessAddressesShare() : addresses_(ProcessAddresses::acquire()) {}
  ~ProcessAddressesShare() { ProcessAddresses::release_user(); }
  ProcessAddressesShare(const ProcessAddressesShare&) = delete;
  ProcessAddressesShare& operator=(const ProcessAddressesShare&) = delete;
  ProcessAddresses* operator->() const { return addresses_; }

 private:
  ProcessAddresses* addresses_;
};

}  // namespace devalloc::vulkan
