#include "vk_buffer.hpp"

#include <cinttypes>

namespace devalloc::vulkan {

Buffer create_buffer(const DeviceFunctions& vk, VkDevice device, const BufferRequest& r) {
  Buffer b;
  b.size = r.size;
  try {
    VkBufferCreateInfo info = {};
    info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    info.size = r.size;
    info.usage = r.usage;
    if (r.device_address) info.usage |= VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vk.vkCreateBuffer(device, &info, nullptr, &b.buffer), r.kind,
          "vkCreateBuffer(device %u, size = %" PRIu64 ", usage = 0x%x)", r.device_index, r.size,
          info.usage);

    VkMemoryRequirements needs = {};
    vk.vkGetBufferMemoryRequirements(device, b.buffer, &needs);
    if ((needs.memoryTypeBits & (1u << r.memory_type)) == 0) {
      throw plugin::Failure{
          DEVALLOC_STATUS_DEVICE_ERROR,
          plugin::format("vkGetBufferMemoryRequirements(device %u, size = %" PRIu64
                         ") allows memory types 0x%x, not type %u that the plugin chose",
                         r.device_index, r.size, needs.memoryTypeBits, r.memory_type)};
    }
    VkMemoryAllocateFlagsInfo flags = {};
    flags.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO;
    flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo allocate = {};
    allocate.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    allocate.pNext = r.device_address ? &flags : nullptr;
    allocate.allocationSize = needs.size;
    allocate.memoryTypeIndex = r.memory_type;
    check(vk.vkAllocateMemory(device, &allocate, nullptr, &b.memory), r.kind,
          "vkAllocateMemory(device %u, allocationSize = %" PRIu64 ", memoryTypeIndex = %u)",
          r.device_index, needs.size, r.memory_type);
    b.memory_size = needs.size;
    check(vk.vkBindBufferMemory(device, b.buffer, b.memory, 0), plugin::CallKind::work,
          "vkBindBufferMemory(device %u, size = %" PRIu64 ", offset = 0)", r.device_index, r.size);
    if (r.map) {
      check(vk.vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), r.kind,
            "vkMapMemory(device %u, offset = 0, size = VK_WHOLE_SIZE of %" PRIu64 ")",
            r.device_index, needs.size);
      plugin::require_memory(b.mapped != nullptr, "vkMapMemory", "VK_SUCCESS");
    }
    if (r.device_address) {
      VkBufferDeviceAddressInfo address = {};
      address.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO;
      address.buffer = b.buffer;
      b.device_address = vk.vkGetBufferDeviceAddress(device, &address);
      if (b.device_address == 0) {
        throw plugin::Failure{
            DEVALLOC_STATUS_DEVICE_ERROR,
            plugin::format("vkGetBufferDeviceAddress(device %u) returned 0", r.device_index)};
      }
    }
  } catch (...) {
    destroy_buffer(vk, device, b);
    throw;
  }
  return b;
}

void destroy_buffer(const DeviceFunctions& vk, VkDevice device, Buffer& b) noexcept {
  if (b.buffer != VK_NULL_HANDLE) vk.vkDestroyBuffer(device, b.buffer, nullptr);
  if (b.memory != VK_NULL_HANDLE) vk.vkFreeMemory(device, b.memory, nullptr);
  b = Buffer{};
}

}  // namespace devalloc::vulkan
