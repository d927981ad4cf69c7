#include "vk_runtime.hpp"

#include <cstdarg>

namespace devalloc::vulkan {
namespace {

using plugin::Failure;

template <class Fn>
void require_function(Fn function, const char* name, const char* how) {
  if (function == nullptr) {
    throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                  plugin::format("%s returned NULL for %s", how, name)};
  }
}

}  // namespace

std::string result_name(VkResult result) {
  switch (result) {
#define DEVALLOC_VK_RESULT(name) \
  case name:                     \
    return #name;
    DEVALLOC_VK_RESULT(VK_SUCCESS)
    DEVALLOC_VK_RESULT(VK_NOT_READY)
    DEVALLOC_VK_RESULT(VK_TIMEOUT)
    DEVALLOC_VK_RESULT(VK_EVENT_SET)
    DEVALLOC_VK_RESULT(VK_EVENT_RESET)
    DEVALLOC_VK_RESULT(VK_INCOMPLETE)
    DEVALLOC_VK_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
    DEVALLOC_VK_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    DEVALLOC_VK_RESULT(VK_ERROR_INITIALIZATION_FAILED)
    DEVALLOC_VK_RESULT(VK_ERROR_DEVICE_LOST)
    DEVALLOC_VK_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
    DEVALLOC_VK_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
    DEVALLOC_VK_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
    DEVALLOC_VK_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
    DEVALLOC_VK_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
    DEVALLOC_VK_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
    DEVALLOC_VK_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
    DEVALLOC_VK_RESULT(VK_ERROR_FRAGMENTED_POOL)
    DEVALLOC_VK_RESULT(VK_ERROR_UNKNOWN)
    DEVALLOC_VK_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
    DEVALLOC_VK_RESULT(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    DEVALLOC_VK_RESULT(VK_ERROR_FRAGMENTATION)
    DEVALLOC_VK_RESULT(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    DEVALLOC_VK_RESULT(VK_ERROR_NOT_PERMITTED_KHR)
#undef DEVALLOC_VK_RESULT
    default:
      return plugin::format("VkResult %d", static_cast<int>(result));
  }
}

void check(VkResult result, plugin::CallKind kind, const char* call_format, ...) {
  if (result == VK_SUCCESS) return;
  const bool out_of_memory = result == VK_ERROR_OUT_OF_DEVICE_MEMORY ||
                             result == VK_ERROR_OUT_OF_HOST_MEMORY ||
                             result == VK_ERROR_TOO_MANY_OBJECTS;
  va_list args;
  va_start(args, call_format);
  std::string call = plugin::vformat(call_format, args);
  va_end(args);
  plugin::raise_vendor_failure(kind, out_of_memory, result_name(result), std::move(call));
}

Loader::Loader(const std::string& path) : library(path, "the Vulkan loader") {
  library.bind(vkGetInstanceProcAddr, "vkGetInstanceProcAddr");
#define DEVALLOC_VK_BIND_GLOBAL(name)                                                \
  name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(VK_NULL_HANDLE, #name)); \
  require_function(name, #name, "vkGetInstanceProcAddr(NULL)");
  DEVALLOC_VK_GLOBAL_FUNCTIONS(DEVALLOC_VK_BIND_GLOBAL)
#undef DEVALLOC_VK_BIND_GLOBAL
}

InstanceFunctions::InstanceFunctions(const Loader& loader, VkInstance instance) {
#define DEVALLOC_VK_BIND_INSTANCE(name)                                               \
  name = reinterpret_cast<PFN_##name>(loader.vkGetInstanceProcAddr(instance, #name)); \
  require_function(name, #name, "vkGetInstanceProcAddr(instance)");
  DEVALLOC_VK_INSTANCE_FUNCTIONS(DEVALLOC_VK_BIND_INSTANCE)
#undef DEVALLOC_VK_BIND_INSTANCE
}

DeviceFunctions::DeviceFunctions(const InstanceFunctions& vk, VkDevice device) {
#define DEVALLOC_VK_BIND_DEVICE(name)                                         \
  name = reinterpret_cast<PFN_##name>(vk.vkGetDeviceProcAddr(device, #name)); \
  require_function(name, #name, "vkGetDeviceProcAddr");
  DEVALLOC_VK_DEVICE_FUNCTIONS(DEVALLOC_VK_BIND_DEVICE)
#undef DEVALLOC_VK_BIND_DEVICE
}

}  // namespace devalloc::vulkan
