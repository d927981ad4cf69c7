// A Vulkan loader for the plugin's tests, given to it as runtime_library:
// every call goes on to the real loader (DEVALLOC_REAL_VULKAN_LOADER) and
// its driver, except that device memory is counted and can be limited
// (vkAllocateMemory, vkFreeMemory), and that VK_EXT_memory_budget, which
// lavapipe lacks, can be offered with the counted memory as the heaps'
// usage. The test reads and sets it through vk_counting_loader.h.
#include "vk_counting_loader.h"

#include <dlfcn.h>
#include <vulkan/vulkan_core.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#define DEVALLOC_TEST_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Memory {
  std::mutex mutex;
  std::unordered_map<VkDeviceMemory, uint64_t> live;  // memory -> allocationSize
  devalloc_test_vk_memory counts = {};
  uint64_t limit = UINT64_MAX;
};

// Destroyed when the library is unloaded: by then neither the plugin nor the
// test holds it.
Memory& memory() {
  static Memory m;
  return m;
}

std::atomic<bool> offer_budget{false};

// The real functions, as the real loader gave them (the same for every
// instance and device of one driver).
std::atomic<PFN_vkGetDeviceProcAddr> real_get_device_proc_addr{nullptr};
std::atomic<PFN_vkAllocateMemory> real_allocate_memory{nullptr};
std::atomic<PFN_vkFreeMemory> real_free_memory{nullptr};
std::atomic<PFN_vkEnumerateDeviceExtensionProperties> real_enumerate_extensions{nullptr};
std::atomic<PFN_vkGetPhysicalDeviceMemoryProperties2> real_memory_properties2{nullptr};

PFN_vkGetInstanceProcAddr real_get_instance_proc_addr() {
  static PFN_vkGetInstanceProcAddr real = [] {
    void* loader = dlopen(DEVALLOC_REAL_VULKAN_LOADER, RTLD_NOW | RTLD_LOCAL);
    if (loader == nullptr) std::abort();
    return reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(loader, "vkGetInstanceProcAddr"));
  }();
  return real;
}

VKAPI_ATTR VkResult VKAPI_CALL allocate_memory(VkDevice device, const VkMemoryAllocateInfo* info,
                                               const VkAllocationCallbacks* callbacks,
                                               VkDeviceMemory* out) {
  Memory& m = memory();
  {
    std::lock_guard lock(m.mutex);
    if (info->allocationSize > m.limit - std::min(m.limit, m.counts.live_bytes)) {
      ++m.counts.refusals;
      return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    }
  }
  const VkResult r = real_allocate_memory.load()(device, info, callbacks, out);
  if (r == VK_SUCCESS) {
    std::lock_guard lock(m.mutex);
    m.live.emplace(*out, info->allocationSize);
    ++m.counts.allocations;
    ++m.counts.live_count;
    m.counts.live_bytes += info->allocationSize;
  }
  return r;
}

VKAPI_ATTR void VKAPI_CALL free_memory(VkDevice device, VkDeviceMemory memory_object,
                                       const VkAllocationCallbacks* callbacks) {
  if (memory_object != VK_NULL_HANDLE) {
    Memory& m = memory();
    std::lock_guard lock(m.mutex);
    const auto it = m.live.find(memory_object);
    if (it != m.live.end()) {
      --m.counts.live_count;
      m.counts.live_bytes -= it->second;
      m.live.erase(it);
    }
  }
  real_free_memory.load()(device, memory_object, callbacks);
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL get_device_proc_addr(VkDevice device, const char* name) {
  const PFN_vkVoidFunction real = real_get_device_proc_addr.load()(device, name);
  if (real == nullptr) return nullptr;
  if (std::strcmp(name, "vkGetDeviceProcAddr") == 0) {
    return reinterpret_cast<PFN_vkVoidFunction>(&get_device_proc_addr);
  }
  if (std::strcmp(name, "vkAllocateMemory") == 0) {
    real_allocate_memory = reinterpret_cast<PFN_vkAllocateMemory>(real);
    return reinterpret_cast<PFN_vkVoidFunction>(&allocate_memory);
  }
  if (std::strcmp(name, "vkFreeMemory") == 0) {
    real_free_memory = reinterpret_cast<PFN_vkFreeMemory>(real);
    return reinterpret_cast<PFN_vkVoidFunction>(&free_memory);
  }
  return real;
}

VKAPI_ATTR VkResult VKAPI_CALL enumerate_extensions(VkPhysicalDevice device, const char* layer,
                                                    uint32_t* count,
                                                    VkExtensionProperties* properties) {
  const auto real = real_enumerate_extensions.load();
  if (!offer_budget || layer != nullptr) return real(device, layer, count, properties);
  uint32_t n = 0;
  VkResult r = real(device, nullptr, &n, nullptr);
  if (r != VK_SUCCESS) return r;
  std::vector<VkExtensionProperties> all(n);
  r = real(device, nullptr, &n, all.data());
  if (r != VK_SUCCESS) return r;
  all.resize(n);
  VkExtensionProperties budget = {};
  std::strcpy(budget.extensionName, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  budget.specVersion = VK_EXT_MEMORY_BUDGET_SPEC_VERSION;
  all.push_back(budget);
  if (properties == nullptr) {
    *count = static_cast<uint32_t>(all.size());
    return VK_SUCCESS;
  }
  const uint32_t given = std::min<uint32_t>(*count, static_cast<uint32_t>(all.size()));
  std::copy_n(all.begin(), given, properties);
  *count = given;
  return given < all.size() ? VK_INCOMPLETE : VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL memory_properties2(VkPhysicalDevice device,
                                              VkPhysicalDeviceMemoryProperties2* properties) {
  // The budget structure is this library's: the driver never sees it.
  VkPhysicalDeviceMemoryBudgetPropertiesEXT* budget = nullptr;
  for (auto* s = reinterpret_cast<VkBaseOutStructure*>(properties); s->pNext != nullptr;
       s = s->pNext) {
    if (s->pNext->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT) {
      budget = reinterpret_cast<VkPhysicalDeviceMemoryBudgetPropertiesEXT*>(s->pNext);
      s->pNext = static_cast<VkBaseOutStructure*>(budget->pNext);
      break;
    }
  }
  real_memory_properties2.load()(device, properties);
  if (budget == nullptr) return;
  budget->pNext = properties->pNext;
  properties->pNext = budget;
  const VkPhysicalDeviceMemoryProperties& p = properties->memoryProperties;
  const uint64_t used = [] {
    std::lock_guard lock(memory().mutex);
    return memory().counts.live_bytes;
  }();
  for (uint32_t h = 0; h < p.memoryHeapCount; ++h) {
    const bool device_local = (p.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
    budget->heapBudget[h] = p.memoryHeaps[h].size;
    budget->heapUsage[h] = device_local ? used : 0;
  }
}

}  // namespace

DEVALLOC_TEST_EXPORT PFN_vkVoidFunction VKAPI_CALL vkGetInstanceProcAddr(VkInstance instance,
                                                                         const char* name) {
  const PFN_vkVoidFunction real = real_get_instance_proc_addr()(instance, name);
  if (real == nullptr) return nullptr;
  if (std::strcmp(name, "vkGetInstanceProcAddr") == 0) {
    return reinterpret_cast<PFN_vkVoidFunction>(&vkGetInstanceProcAddr);
  }
  if (std::strcmp(name, "vkGetDeviceProcAddr") == 0) {
    real_get_device_proc_addr = reinterpret_cast<PFN_vkGetDeviceProcAddr>(real);
    return reinterpret_cast<PFN_vkVoidFunction>(&get_device_proc_addr);
  }
  if (std::strcmp(name, "vkEnumerateDeviceExtensionProperties") == 0) {
    real_enumerate_extensions = reinterpret_cast<PFN_vkEnumerateDeviceExtensionProperties>(real);
    return reinterpret_cast<PFN_vkVoidFunction>(&enumerate_extensions);
  }
  if (std::strcmp(name, "vkGetPhysicalDeviceMemoryProperties2") == 0) {
    real_memory_properties2 = reinterpret_cast<PFN_vkGetPhysicalDeviceMemoryProperties2>(real);
    return reinterpret_cast<PFN_vkVoidFunction>(&memory_properties2);
  }
  return real;
}

DEVALLOC_TEST_EXPORT void devalloc_test_vk_read_memory(devalloc_test_vk_memory* out) {
  std::lock_guard lock(memory().mutex);
  *out = memory().counts;
}

DEVALLOC_TEST_EXPORT void devalloc_test_vk_limit_memory(uint64_t live_bytes) {
  std::lock_guard lock(memory().mutex);
  memory().limit = live_bytes;
}

DEVALLOC_TEST_EXPORT void devalloc_test_vk_offer_budget(int offer) { offer_budget = offer != 0; }
