// A VkBuffer bound at offset 0 to a VkDeviceMemory of its own, mapped into
// the host for its whole life when its memory is host-visible: what backs
// an allocation, a staging buffer from allocate_host, and a bounce chunk.
#pragma once

#include <vulkan/vulkan_core.h>

#include <cstdint>

#include "vk_runtime.hpp"

namespace devalloc::vulkan {

struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;  // the memory's offset 0, when host-visible
  uint64_t size = 0;
  uint64_t memory_size = 0;  // of the VkDeviceMemory: size, rounded up by the driver
  VkDeviceAddress device_address = 0;  // with device_address only
};

struct BufferRequest {
  uint64_t size = 0;
  VkBufferUsageFlags usage = 0;
  uint32_t memory_type = 0;
  bool map = false;             // vkMapMemory the whole memory
  bool device_address = false;  // SHADER_DEVICE_ADDRESS usage, address read
  plugin::CallKind kind = plugin::CallKind::device_allocation;
  uint32_t device_index = 0;  // for messages
};

// Creates, allocates, binds and maps; throws Failure naming the call that
// failed, with what was created destroyed again.
Buffer create_buffer(const DeviceFunctions& vk, VkDevice device, const BufferRequest& request);
// Destroys the buffer and frees its memory (which unmaps it). Never throws.
void destroy_buffer(const DeviceFunctions& vk, VkDevice device, Buffer& buffer) noexcept;

}  // namespace devalloc::vulkan
