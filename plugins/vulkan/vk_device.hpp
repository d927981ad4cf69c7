// One Vulkan physical device as the plugin drives it: a VkDevice with one
// queue of a transfer-capable family, a ring of reused command buffers, a
// timeline semaphore that every submission signals with the next value,
// and the kit's FenceReleases, whose worker waits those values in order and
// fires the releases of "until released" copies as soon as their copies
// are over. Each allocation is a VkBuffer with a VkDeviceMemory of its own
// (vk_buffer.hpp); freed ones are kept for reuse (vk_buffer_cache.hpp).
#pragma once

#include <vulkan/vulkan_core.h>

#include <atomic>
#include <cstdint>
#include <devalloc/plugin_kit/fence_releases.hpp>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/release.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "vk_addresses.hpp"
#include "vk_buffer.hpp"
#include "vk_buffer_cache.hpp"
#include "vk_runtime.hpp"

namespace devalloc::vulkan {

// What the plugin hands out as a device address (docs/plugins/vulkan.md).
enum class AddressModel {
  // vkGetBufferDeviceAddress where the device has bufferDeviceAddress,
  // else window.
  buffer_device_address,
  // A window of an address range that the plugin hands out once per
  // process, whatever the device: base + k maps back to (buffer, k).
  window,
};

// The plugin's options, as each device uses them.
struct DeviceSettings {
  AddressModel address_model = AddressModel::buffer_device_address;
  // Bytes of freed allocations each device keeps for reuse; at most
  // VulkanDevice::kCacheHeapQuarters quarters of its device memory heap.
  uint64_t cache_bytes = UINT64_MAX;
};

// What the instance learned of a physical device before opening it.
struct PhysicalDevice {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
};

class VulkanDevice {
 public:
  static constexpr uint64_t kNaturalAlignment = 256;
  static constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;
  // Command buffers in the ring: submissions in flight before a new one
  // waits for the oldest.
  static constexpr uint32_t kCommandBuffers = 16;
  // Bounce chunks for sources outside staging memory, and their size.
  static constexpr uint32_t kBounceChunks = 4;
  static constexpr uint64_t kBounceChunkBytes = uint64_t{4} << 20;
  // The most of the device memory heap the cache keeps, in quarters: the
  // rest stays with the driver for whoever else allocates on the device.
  static constexpr uint64_t kCacheHeapQuarters = 3;

  // Creates the VkDevice, its queue, command pool and buffers and the
  // timeline semaphore. Throws Failure; what was created is destroyed.
  VulkanDevice(const InstanceFunctions& vki, const PhysicalDevice& physical, uint32_t index,
               const DeviceSettings& settings);
  // Waits for all work, fires every release, frees every allocation,
  // cached buffer and staging buffer, destroys the device. Never throws.
  ~VulkanDevice();
  VulkanDevice(const VulkanDevice&) = delete;
  VulkanDevice& operator=(const VulkanDevice&) = delete;

  const plugin::DeviceDescription& description() const { return description_; }
  plugin::MemoryInfo memory_info() const;
  // Device memory is host-visible: map_to_host works.
  bool mappable() const { return (device_memory_flags_ & kHostVisible) != 0; }

  uint64_t allocate(uint64_t nbytes, uint64_t alignment);
  void deallocate(uint64_t address);
  void* map_to_host(uint64_t address, uint64_t nbytes);
  void unmap_from_host(void* host);

  void* allocate_staging(uint64_t nbytes);
  void free_staging(void* host);

  void copy_during_call(uint64_t dst, const void* src, uint64_t nbytes);
  void copy_until_released(uint64_t dst, const void* src, uint64_t nbytes, plugin::Release release);
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes);
  // Every copy submitted before has landed and been released; reports
  // (once) a copy that failed since the last synchronize, and a lost
  // device every time.
  void synchronize();
  // Waits for every submission and fires every release, reporting
  // nothing: for destroy.
  void quiesce() noexcept;

 private:
  static constexpr VkMemoryPropertyFlags kHostVisible = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
  static constexpr VkMemoryPropertyFlags kHostCoherent = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;

  struct Allocation {
    Buffer buffer;
    uint64_t base = 0;    // the address of the buffer's byte 0
    uint64_t nbytes = 0;  // what was asked for, from the address handed out
  };
  // A range of a live allocation: its buffer, and the range's offset in it.
  struct Located {
    VkBuffer buffer = VK_NULL_HANDLE;
    uint64_t offset = 0;
  };
  struct Mapping {
    uint64_t allocation = 0;  // the address handed out
    uint64_t offset = 0;      // in the memory
    uint64_t nbytes = 0;
  };
  struct CommandSlot {
    VkCommandBuffer buffer = VK_NULL_HANDLE;
    uint64_t value = 0;  // signalled when its last submission is over
  };
  struct Chunk {
    Buffer buffer;
    uint64_t value = 0;  // signalled when the copy that reads it is over
  };

  void choose_memory_types(const VkPhysicalDeviceMemoryProperties& memory);
  void create_objects(const PhysicalDevice& physical, bool device_address);
  void destroy_objects() noexcept;

  // A new buffer of device memory; when the driver is out of memory, the
  // cache is given back to it and the buffer asked for once more.
  Buffer create_device_buffer(const BufferRequest& request);
  // The allocation holding [address, +nbytes); throws INVALID_ARGUMENT
  // naming the range, the role and PLUGIN-15. allocations_mutex_ held.
  std::map<uint64_t, Allocation>::iterator find(uint64_t address, uint64_t nbytes, const char* role,
                                                const char* rule);
  Located locate(uint64_t address, uint64_t nbytes, const char* role);
  // The staging buffer holding [src, +nbytes), if any.
  std::optional<Located> staged(const void* src, uint64_t nbytes);

  // Records and submits one copy into the next command buffer of the
  // ring, signalling the next value; pushes `release` with it. Throws with
  // `release` untouched when nothing was submitted. submit_mutex_ held.
  uint64_t submit_copy(VkBuffer src, VkBuffer dst, const VkBufferCopy& region,
                       plugin::Release&& release, const char* what);
  // Copies from host memory that is not staging memory through the bounce
  // chunks; src has been read when this returns. Returns the last value.
  // submit_mutex_ held.
  uint64_t bounce_to_device(const Located& dst, const void* src, uint64_t nbytes);
  // The next bounce chunk, free (created on first use). submit_mutex_ held.
  Chunk& next_chunk();
  // Blocks until the timeline reaches value. Throws Failure when the device
  // is lost; a wait that fails otherwise is retried by polling, since the
  // work may still run.
  void wait_value(uint64_t value) const;
  void mark_lost(const char* answered) const noexcept;
  void require_alive() const;
  uint64_t last_submitted();

  const InstanceFunctions& vki_;
  // Acquired first, given back last.
  ProcessAddressesShare addresses_;
  VkPhysicalDevice physical_;
  uint32_t index_;
  plugin::DeviceDescription description_;
  bool has_memory_budget_ = false;
  uint64_t non_coherent_atom_ = 1;
  uint64_t device_heap_bytes_ = 0;  // of device_memory_type_'s heap
  bool device_addresses_ = false;  // the buffer_device_address model
  uint32_t device_memory_type_ = 0;
  VkMemoryPropertyFlags device_memory_flags_ = 0;
  uint32_t host_memory_type_ = 0;

  VkDevice device_ = VK_NULL_HANDLE;
  std::optional<DeviceFunctions> vk_;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkSemaphore timeline_ = VK_NULL_HANDLE;

  // Queue submission and command buffer recording are externally
  // synchronized: one thread at a time records and submits.
  std::mutex submit_mutex_;
  std::vector<CommandSlot> slots_;
  uint32_t next_slot_ = 0;
  uint64_t last_value_ = 0;
  std::vector<Chunk> chunks_;
  uint32_t next_chunk_ = 0;

  std::mutex allocations_mutex_;
  std::map<uint64_t, Allocation> allocations_;  // by the address handed out
  std::multimap<void*, Mapping> mappings_;
  std::map<const void*, Buffer> staging_;  // by the mapped pointer
  std::atomic<uint64_t> used_bytes_{0};
  // Made with the VkDevice, destroyed before it.
  std::optional<BufferCache> cache_;

  mutable std::atomic<bool> lost_{false};
  mutable std::atomic<const char*> lost_by_{nullptr};
  // Last: its worker waits on the timeline; destroyed (reset) first.
  std::optional<plugin::FenceReleases> fences_;
};

}  // namespace devalloc::vulkan
