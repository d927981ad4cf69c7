// (a) and (b) on Vulkan: the first physical device of the loader
// libvulkan.so.1 (on these machines Mesa's lavapipe), opened at run time.
//   (a) vkCmdCopyBuffer from a HOST_VISIBLE|HOST_COHERENT staging buffer to
//       a DEVICE_LOCAL buffer (one without HOST_VISIBLE when the device has
//       such memory), one command buffer and fence per chunk in flight;
//   (b) vkMapMemory of a DEVICE_LOCAL|HOST_VISIBLE allocation, a memcpy into
//       it (flushed when not HOST_COHERENT), vkUnmapMemory.
#include "driver_bench.hpp"

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace devalloc::bench {
namespace {

#define DEVALLOC_VK_INSTANCE_FUNCTIONS(X)   \
  X(vkDestroyInstance)                      \
  X(vkEnumeratePhysicalDevices)             \
  X(vkGetPhysicalDeviceProperties)          \
  X(vkGetPhysicalDeviceMemoryProperties)    \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkCreateDevice)                         \
  X(vkGetDeviceProcAddr)

#define DEVALLOC_VK_DEVICE_FUNCTIONS(X) \
  X(vkDestroyDevice)                    \
  X(vkDeviceWaitIdle)                   \
  X(vkGetDeviceQueue)                   \
  X(vkCreateBuffer)                     \
  X(vkDestroyBuffer)                    \
  X(vkGetBufferMemoryRequirements)      \
  X(vkAllocateMemory)                   \
  X(vkFreeMemory)                       \
  X(vkBindBufferMemory)                 \
  X(vkMapMemory)                        \
  X(vkUnmapMemory)                      \
  X(vkFlushMappedMemoryRanges)          \
  X(vkCreateCommandPool)                \
  X(vkDestroyCommandPool)               \
  X(vkAllocateCommandBuffers)           \
  X(vkResetCommandBuffer)               \
  X(vkBeginCommandBuffer)               \
  X(vkEndCommandBuffer)                 \
  X(vkCmdCopyBuffer)                    \
  X(vkQueueSubmit)                      \
  X(vkCreateFence)                      \
  X(vkDestroyFence)                     \
  X(vkWaitForFences)                    \
  X(vkResetFences)

struct Vk {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkCreateInstance vkCreateInstance = nullptr;
#define DEVALLOC_VK_MEMBER(name) PFN_##name name = nullptr;
  DEVALLOC_VK_INSTANCE_FUNCTIONS(DEVALLOC_VK_MEMBER)
  DEVALLOC_VK_DEVICE_FUNCTIONS(DEVALLOC_VK_MEMBER)
#undef DEVALLOC_VK_MEMBER
};

std::string result_text(VkResult r) {
  switch (r) {
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    default: return "VkResult " + std::to_string(static_cast<int>(r));
  }
}

void vk_check(VkResult r, const std::string& call) {
  if (r != VK_SUCCESS) throw DriverError(call + " returned " + result_text(r));
}

// A fence wait of a copy that has not landed after this long is a failure,
// not a bench figure.
constexpr uint64_t kFenceTimeoutNs = 60'000'000'000;

class VulkanPaths final : public DriverPaths {
 public:
  VulkanPaths(void* library, uint64_t nbytes, uint64_t chunk)
      : library_(library), nbytes_(nbytes), chunk_(chunk) {}
  ~VulkanPaths() override;

  // False (the reason in *skipped) when libvulkan.so.1 has no usable device.
  bool open(const std::byte* src, std::string* skipped);

  std::string device_name() const override { return name_; }
  void copy_through_staging() override;
  void copy_into_mapping(const std::byte* src) override;
  std::string check_copied(const std::byte* expected) override {
    return read_back(copied_.buffer, expected);
  }
  std::string check_mapped(const std::byte* expected) override {
    return read_back(mapped_.buffer, expected);
  }

 private:
  struct Allocation {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkMemoryPropertyFlags flags = 0;
  };
  bool open_device(std::string* skipped);
  Allocation allocate(const char* what, VkMemoryPropertyFlags required,
                      VkMemoryPropertyFlags avoided);
  void free(Allocation& a);
  // Records and submits one copy on slot `slot`, after the slot's previous
  // copy landed.
  void submit_copy(int slot, VkBuffer from, VkBuffer to, uint64_t offset, uint64_t n);
  void wait(int slot);
  std::string read_back(VkBuffer buffer, const std::byte* expected);

  void* library_;
  const uint64_t nbytes_;
  const uint64_t chunk_;
  Vk vk_;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_{};
  VkDevice device_ = VK_NULL_HANDLE;
  bool device_functions_ = false;  // every one of DEVALLOC_VK_DEVICE_FUNCTIONS loaded
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer commands_[2] = {};
  VkFence fences_[2] = {};
  bool pending_[2] = {false, false};
  Allocation staging_, copied_, mapped_;
  std::byte* staging_host_ = nullptr;
  std::string name_;
};

VulkanPaths::~VulkanPaths() {
  if (device_ != VK_NULL_HANDLE && !device_functions_) {
    if (vk_.vkDestroyDevice != nullptr) vk_.vkDestroyDevice(device_, nullptr);
  } else if (device_ != VK_NULL_HANDLE) {
    vk_.vkDeviceWaitIdle(device_);
    if (staging_host_ != nullptr) vk_.vkUnmapMemory(device_, staging_.memory);
    free(staging_);
    free(copied_);
    free(mapped_);
    for (VkFence f : fences_) {
      if (f != VK_NULL_HANDLE) vk_.vkDestroyFence(device_, f, nullptr);
    }
    if (pool_ != VK_NULL_HANDLE) vk_.vkDestroyCommandPool(device_, pool_, nullptr);
    vk_.vkDestroyDevice(device_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vk_.vkDestroyInstance(instance_, nullptr);
  ::dlclose(library_);
}

bool VulkanPaths::open(const std::byte* src, std::string* skipped) {
  vk_.vkGetInstanceProcAddr =
      reinterpret_cast<PFN_vkGetInstanceProcAddr>(::dlsym(library_, "vkGetInstanceProcAddr"));
  if (vk_.vkGetInstanceProcAddr == nullptr) {
    *skipped = "libvulkan.so.1 has no vkGetInstanceProcAddr";
    return false;
  }
  vk_.vkCreateInstance = reinterpret_cast<PFN_vkCreateInstance>(
      vk_.vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkCreateInstance"));
  if (vk_.vkCreateInstance == nullptr) {
    *skipped = "vkGetInstanceProcAddr(NULL, \"vkCreateInstance\") returned NULL";
    return false;
  }
  VkApplicationInfo app{};
  app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
  app.pApplicationName = "devalloc_driver_bench";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
  info.pApplicationInfo = &app;
  if (VkResult r = vk_.vkCreateInstance(&info, nullptr, &instance_); r != VK_SUCCESS) {
    instance_ = VK_NULL_HANDLE;
    *skipped = "vkCreateInstance(apiVersion = 1.1) returned " + result_text(r);
    return false;
  }
#define DEVALLOC_VK_LOAD(name)                                                            \
  vk_.name = reinterpret_cast<PFN_##name>(vk_.vkGetInstanceProcAddr(instance_, #name)); \
  if (vk_.name == nullptr) throw DriverError("vkGetInstanceProcAddr(\"" #name "\") returned NULL");
  DEVALLOC_VK_INSTANCE_FUNCTIONS(DEVALLOC_VK_LOAD)
#undef DEVALLOC_VK_LOAD
  if (!open_device(skipped)) return false;

  staging_ = allocate("staging", VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                     VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
  void* host = nullptr;
  vk_check(vk_.vkMapMemory(device_, staging_.memory, 0, VK_WHOLE_SIZE, 0, &host),
        "vkMapMemory(staging, " + std::to_string(nbytes_) + " bytes)");
  staging_host_ = static_cast<std::byte*>(host);
  std::memcpy(staging_host_, src, nbytes_);
  copied_ = allocate("device buffer of (a)", VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                     VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
  mapped_ = allocate("mapped buffer of (b)",
                     VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, 0);
  // Touched once: (b) measures the steady state, not first-touch faults.
  vk_check(vk_.vkMapMemory(device_, mapped_.memory, 0, VK_WHOLE_SIZE, 0, &host),
        "vkMapMemory(mapped buffer, " + std::to_string(nbytes_) + " bytes)");
  std::memset(host, 0, nbytes_);
  vk_.vkUnmapMemory(device_, mapped_.memory);
  return true;
}

bool VulkanPaths::open_device(std::string* skipped) {
  uint32_t count = 0;
  vk_check(vk_.vkEnumeratePhysicalDevices(instance_, &count, nullptr), "vkEnumeratePhysicalDevices");
  if (count == 0) {
    *skipped = "vkEnumeratePhysicalDevices found no device";
    return false;
  }
  std::vector<VkPhysicalDevice> devices(count);
  vk_check(vk_.vkEnumeratePhysicalDevices(instance_, &count, devices.data()),
        "vkEnumeratePhysicalDevices");
  // Device 0, as the plugin's vulkan:0.
  physical_ = devices[0];
  VkPhysicalDeviceProperties properties{};
  vk_.vkGetPhysicalDeviceProperties(physical_, &properties);
  name_ = properties.deviceName;
  vk_.vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);

  uint32_t families = 0;
  vk_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &families, nullptr);
  std::vector<VkQueueFamilyProperties> family(families);
  vk_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &families, family.data());
  // Graphics and compute queues can transfer too (the spec lets them omit
  // the bit).
  constexpr VkQueueFlags kCanCopy =
      VK_QUEUE_TRANSFER_BIT | VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT;
  uint32_t chosen = families;
  for (uint32_t i = 0; i < families && chosen == families; ++i) {
    if ((family[i].queueFlags & kCanCopy) != 0 && family[i].queueCount > 0) chosen = i;
  }
  if (chosen == families) {
    *skipped = name_ + " has no queue family that can copy";
    return false;
  }
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue{};
  queue.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
  queue.queueFamilyIndex = chosen;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkDeviceCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue;
  vk_check(vk_.vkCreateDevice(physical_, &info, nullptr, &device_),
        "vkCreateDevice(" + name_ + ", queue family " + std::to_string(chosen) + ")");
#define DEVALLOC_VK_LOAD(name)                                                        \
  vk_.name = reinterpret_cast<PFN_##name>(vk_.vkGetDeviceProcAddr(device_, #name)); \
  if (vk_.name == nullptr) throw DriverError("vkGetDeviceProcAddr(\"" #name "\") returned NULL");
  DEVALLOC_VK_DEVICE_FUNCTIONS(DEVALLOC_VK_LOAD)
#undef DEVALLOC_VK_LOAD
  device_functions_ = true;
  vk_.vkGetDeviceQueue(device_, chosen, 0, &queue_);

  VkCommandPoolCreateInfo pool{};

  pool.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = chosen;
  vk_check(vk_.vkCreateCommandPool(device_, &pool, nullptr, &pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo buffers{};
  buffers.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
  buffers.commandPool = pool_;
  buffers.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  buffers.commandBufferCount = 2;
  vk_check(vk_.vkAllocateCommandBuffers(device_, &buffers, commands_),
        "vkAllocateCommandBuffers(count = 2)");
  for (VkFence& f : fences_) {
    VkFenceCreateInfo fence{};
    fence.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    vk_check(vk_.vkCreateFence(device_, &fence, nullptr, &f), "vkCreateFence");
  }
  return true;
}

VulkanPaths::Allocation VulkanPaths::allocate(const char* what, VkMemoryPropertyFlags required,
                                              VkMemoryPropertyFlags avoided) {
  Allocation a;
  VkBufferCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  info.size = nbytes_;
  info.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  vk_check(vk_.vkCreateBuffer(device_, &info, nullptr, &a.buffer),
        std::string("vkCreateBuffer(") + what + ", size = " + std::to_string(nbytes_) + ")");
  VkMemoryRequirements needs{};
  vk_.vkGetBufferMemoryRequirements(device_, a.buffer, &needs);
  uint32_t type = memory_.memoryTypeCount;
  for (int pass = 0; pass < 2 && type == memory_.memoryTypeCount; ++pass) {
    for (uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
      const VkMemoryPropertyFlags flags = memory_.memoryTypes[i].propertyFlags;
      if ((needs.memoryTypeBits & (1u << i)) == 0 || (flags & required) != required) continue;
      if (pass == 0 && (flags & avoided) != 0) continue;
      type = i;
      break;
    }
  }
  if (type == memory_.memoryTypeCount) {
    vk_.vkDestroyBuffer(device_, a.buffer, nullptr);
    char flags[16];
    std::snprintf(flags, sizeof flags, "0x%x", static_cast<unsigned>(required));
    throw DriverError(name_ + " has no memory type with property flags " + flags +
                      " for the " + what);
  }
  a.flags = memory_.memoryTypes[type].propertyFlags;
  VkMemoryAllocateInfo allocation{};
  allocation.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
  allocation.allocationSize = needs.size;
  allocation.memoryTypeIndex = type;
  if (VkResult r = vk_.vkAllocateMemory(device_, &allocation, nullptr, &a.memory);
      r != VK_SUCCESS) {
    vk_.vkDestroyBuffer(device_, a.buffer, nullptr);
    vk_check(r, std::string("vkAllocateMemory(") + what + ", size = " + std::to_string(needs.size) +
                 ", memory type " + std::to_string(type) + ")");
  }
  vk_check(vk_.vkBindBufferMemory(device_, a.buffer, a.memory, 0),
        std::string("vkBindBufferMemory(") + what + ")");
  return a;
}

void VulkanPaths::free(Allocation& a) {
  if (a.buffer != VK_NULL_HANDLE) vk_.vkDestroyBuffer(device_, a.buffer, nullptr);
  if (a.memory != VK_NULL_HANDLE) vk_.vkFreeMemory(device_, a.memory, nullptr);
  a = Allocation{};
}

void VulkanPaths::wait(int slot) {
  if (!pending_[slot]) return;
  vk_check(vk_.vkWaitForFences(device_, 1, &fences_[slot], VK_TRUE, kFenceTimeoutNs),
        "vkWaitForFences(copy slot " + std::to_string(slot) + ", 60 s)");
  vk_check(vk_.vkResetFences(device_, 1, &fences_[slot]), "vkResetFences");
  pending_[slot] = false;
}

void VulkanPaths::submit_copy(int slot, VkBuffer from, VkBuffer to, uint64_t offset, uint64_t n) {
  wait(slot);
  VkCommandBuffer cb = commands_[slot];
  vk_check(vk_.vkResetCommandBuffer(cb, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo begin{};
  begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vk_check(vk_.vkBeginCommandBuffer(cb, &begin), "vkBeginCommandBuffer");
  const VkBufferCopy region{offset, offset, n};
  vk_.vkCmdCopyBuffer(cb, from, to, 1, &region);
  vk_check(vk_.vkEndCommandBuffer(cb), "vkEndCommandBuffer");
  VkSubmitInfo submit{};
  submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &cb;
  vk_check(vk_.vkQueueSubmit(queue_, 1, &submit, fences_[slot]),
        "vkQueueSubmit(vkCmdCopyBuffer, offset = " + std::to_string(offset) +
            ", size = " + std::to_string(n) + ")");
  pending_[slot] = true;
}

void VulkanPaths::copy_through_staging() {
  int slot = 0;
  for (uint64_t at = 0; at < nbytes_; at += chunk_, slot ^= 1) {
    submit_copy(slot, staging_.buffer, copied_.buffer, at, std::min(chunk_, nbytes_ - at));
  }
  wait(0);
  wait(1);
}

void VulkanPaths::copy_into_mapping(const std::byte* src) {
  void* host = nullptr;
  vk_check(vk_.vkMapMemory(device_, mapped_.memory, 0, VK_WHOLE_SIZE, 0, &host),
        "vkMapMemory(mapped buffer, " + std::to_string(nbytes_) + " bytes)");
  two_thread_copy(static_cast<std::byte*>(host), src, nbytes_);
  if ((mapped_.flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) == 0) {
    VkMappedMemoryRange range{};
    range.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE;
    range.memory = mapped_.memory;
    range.size = VK_WHOLE_SIZE;
    vk_check(vk_.vkFlushMappedMemoryRanges(device_, 1, &range), "vkFlushMappedMemoryRanges");
  }
  vk_.vkUnmapMemory(device_, mapped_.memory);
}

// Read back into the staging buffer (cleared first), compared, and the
// staging filled with the source again for later copies.
std::string VulkanPaths::read_back(VkBuffer buffer, const std::byte* expected) {
  std::memset(staging_host_, 0, nbytes_);
  submit_copy(0, buffer, staging_.buffer, 0, nbytes_);
  wait(0);
  std::string wrong = first_difference(staging_host_, expected, nbytes_, 0, nbytes_);
  std::memcpy(staging_host_, expected, nbytes_);
  return wrong;
}

}  // namespace

std::unique_ptr<DriverPaths> open_vulkan(const std::byte* src, uint64_t nbytes, uint64_t chunk,
                                         std::string* skipped) {
  void* library = ::dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    *skipped = std::string("dlopen(\"libvulkan.so.1\"): ") + (why ? why : "failed");
    return nullptr;
  }
  auto paths = std::make_unique<VulkanPaths>(library, nbytes, chunk);
  if (!paths->open(src, skipped)) return nullptr;
  return paths;
}

}  // namespace devalloc::bench
