// The Vulkan loader as this plugin sees it: a library opened at run time (no
// link-time dependency on libvulkan), vkGetInstanceProcAddr looked up by
// name, every other function through it (instance level) or through
// vkGetDeviceProcAddr (device level), each list an X-macro; and every
// VkResult other than VK_SUCCESS turned into a Failure that names the call,
// its arguments and the result by name.
#pragma once

#include <vulkan/vulkan_core.h>

#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>
#include <string>

namespace devalloc::vulkan {

// Looked up with vkGetInstanceProcAddr(NULL, name).
#define DEVALLOC_VK_GLOBAL_FUNCTIONS(X) \
  X(vkEnumerateInstanceVersion)         \
  X(vkCreateInstance)

// Looked up with vkGetInstanceProcAddr(instance, name).
#define DEVALLOC_VK_INSTANCE_FUNCTIONS(X)     \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceMemoryProperties2)     \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

// Looked up with vkGetDeviceProcAddr(device, name): all core 1.2.
#define DEVALLOC_VK_DEVICE_FUNCTIONS(X) \
  X(vkDestroyDevice)                    \
  X(vkGetDeviceQueue)                   \
  X(vkDeviceWaitIdle)                   \
  X(vkCreateBuffer)                     \
  X(vkDestroyBuffer)                    \
  X(vkGetBufferMemoryRequirements)      \
  X(vkGetBufferDeviceAddress)           \
  X(vkAllocateMemory)                   \
  X(vkFreeMemory)                       \
  X(vkBindBufferMemory)                 \
  X(vkMapMemory)                        \
  X(vkUnmapMemory)                      \
  X(vkFlushMappedMemoryRanges)          \
  X(vkInvalidateMappedMemoryRanges)     \
  X(vkCreateCommandPool)                \
  X(vkDestroyCommandPool)               \
  X(vkAllocateCommandBuffers)           \
  X(vkResetCommandBuffer)               \
  X(vkBeginCommandBuffer)               \
  X(vkEndCommandBuffer)                 \
  X(vkCmdCopyBuffer)                    \
  X(vkCmdPipelineBarrier)               \
  X(vkQueueSubmit)                      \
  X(vkCreateSemaphore)                  \
  X(vkDestroySemaphore)                 \
  X(vkWaitSemaphores)                   \
  X(vkGetSemaphoreCounterValue)

#define DEVALLOC_VK_DECLARE_FUNCTION(name) PFN_##name name = nullptr;

// "VK_ERROR_DEVICE_LOST", or "VkResult -1000..." for a code this plugin
// does not know.
std::string result_name(VkResult result);

// Throws Failure unless result is VK_SUCCESS: "<call> failed: <name>", the
// call printf-formatted; the status follows from kind
// (plugin::status_of_failed_call).
void check(VkResult result, plugin::CallKind kind, const char* call_format, ...)
    __attribute__((format(printf, 3, 4)));

// The loader library and its global functions.
class Loader {
 public:
  // Opens `path`; throws Failure(RUNTIME_UNAVAILABLE) naming it and the
  // dlerror text, or the function that is missing.
  explicit Loader(const std::string& path);

  plugin::RuntimeLibrary library;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  DEVALLOC_VK_GLOBAL_FUNCTIONS(DEVALLOC_VK_DECLARE_FUNCTION)
};

struct InstanceFunctions {
  // Throws Failure naming the first function the loader does not give.
  InstanceFunctions(const Loader& loader, VkInstance instance);
  DEVALLOC_VK_INSTANCE_FUNCTIONS(DEVALLOC_VK_DECLARE_FUNCTION)
};

struct DeviceFunctions {
  DeviceFunctions(const InstanceFunctions& vk, VkDevice device);
  DEVALLOC_VK_DEVICE_FUNCTIONS(DEVALLOC_VK_DECLARE_FUNCTION)
};

}  // namespace devalloc::vulkan
