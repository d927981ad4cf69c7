#include "vk_device.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <devalloc/plugin_kit/allocation_table.hpp>
#include <memory>
#include <thread>
#include <utility>

namespace devalloc::vulkan {

namespace {

using plugin::CallKind;
using plugin::Failure;

constexpr CallKind kWork = CallKind::work;
constexpr devalloc_status kDeviceError = DEVALLOC_STATUS_DEVICE_ERROR;
constexpr devalloc_status kInvalid = DEVALLOC_STATUS_INVALID_ARGUMENT;
constexpr VkBufferUsageFlags kTransfer =
    VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
// After a failed wait the timeline is asked again, first this soon, then
// twice as late each time, up to the longest pause.
constexpr std::chrono::microseconds kFirstPoll{100};
constexpr std::chrono::microseconds kLongestPoll{10000};

uint64_t address_of(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

bool has_extension(const InstanceFunctions& vki, VkPhysicalDevice device, uint32_t index,
                   const char* name) {
  uint32_t count = 0;
  check(vki.vkEnumerateDeviceExtensionProperties(device, nullptr, &count, nullptr), kWork,
        "vkEnumerateDeviceExtensionProperties(device %u, count)", index);
  std::vector<VkExtensionProperties> all(count);
  check(vki.vkEnumerateDeviceExtensionProperties(device, nullptr, &count, all.data()), kWork,
        "vkEnumerateDeviceExtensionProperties(device %u)", index);
  all.resize(count);
  return std::any_of(all.begin(), all.end(), [&](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, name) == 0;
  });
}

}  // namespace

VulkanDevice::VulkanDevice(const InstanceFunctions& vki, const PhysicalDevice& physical,
                           uint32_t index, const DeviceSettings& settings)
    : vki_(vki), physical_(physical.handle), index_(index) {
  const bool has_pci = has_extension(vki, physical_, index, VK_EXT_PCI_BUS_INFO_EXTENSION_NAME);
  has_memory_budget_ = has_extension(vki, physical_, index, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);

  // Physical-device queries of a device extension need only its support.
  VkPhysicalDevicePCIBusInfoPropertiesEXT pci = {};
  pci.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT;
  VkPhysicalDeviceIDProperties id = {};
  id.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES;
  id.pNext = has_pci ? &pci : nullptr;
  VkPhysicalDeviceProperties2 properties = {};
  properties.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
  properties.pNext = &id;
  vki.vkGetPhysicalDeviceProperties2(physical_, &properties);
  const VkPhysicalDeviceProperties& p = properties.properties;
  description_.name.assign(p.deviceName, strnlen(p.deviceName, sizeof p.deviceName));
  std::memcpy(description_.uuid.data(), id.deviceUUID, description_.uuid.size());
  if (has_pci) {
    description_.pci_bus_id = plugin::format("%04x:%02x:%02x.%x", pci.pciDomain, pci.pciBus,
                                             pci.pciDevice, pci.pciFunction);
  }
  description_.dlpack_device_type = DEVALLOC_DLPACK_VULKAN;
  description_.dlpack_device_id = static_cast<int32_t>(index);
  non_coherent_atom_ = std::max<uint64_t>(p.limits.nonCoherentAtomSize, 1);

  VkPhysicalDeviceMemoryProperties memory = {};
  vki.vkGetPhysicalDeviceMemoryProperties(physical_, &memory);
  for (uint32_t h = 0; h < memory.memoryHeapCount; ++h) {
    if (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      description_.total_memory_bytes += memory.memoryHeaps[h].size;
    }
  }

  VkPhysicalDeviceVulkan12Features features12 = {};
  features12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  VkPhysicalDeviceFeatures2 features = {};
  features.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  features.pNext = &features12;
  vki.vkGetPhysicalDeviceFeatures2(physical_, &features);
  if (!features12.timelineSemaphore) {
    throw Failure{kDeviceError, plugin::format("device %u (%s) has no timelineSemaphore feature, "
                                               "which Vulkan 1.2 requires",
                                               index, description_.name.c_str())};
  }
  device_addresses_ =
      settings.address_model == AddressModel::buffer_device_address &&
      features12.bufferDeviceAddress;

  try {
    create_objects(physical, device_addresses_);
    choose_memory_types(memory);
    cache_.emplace(*vk_, device_,
                   std::min(settings.cache_bytes, device_heap_bytes_ / 4 * kCacheHeapQuarters));
    fences_.emplace([this](uint64_t value) { wait_value(value); });
  } catch (...) {
    destroy_objects();
    throw;
  }
}

void VulkanDevice::create_objects(const PhysicalDevice& physical, bool device_address) {
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue = {};
  queue.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
  queue.queueFamilyIndex = physical.queue_family;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkPhysicalDeviceVulkan12Features enable = {};
  enable.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  enable.timelineSemaphore = VK_TRUE;
  enable.bufferDeviceAddress = device_address ? VK_TRUE : VK_FALSE;
  VkDeviceCreateInfo info = {};
  info.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
  info.pNext = &enable;
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue;
  check(vki_.vkCreateDevice(physical_, &info, nullptr, &device_), kWork,
        "vkCreateDevice(device %u, queue family %u, timelineSemaphore%s)", index_,
        physical.queue_family, device_address ? ", bufferDeviceAddress" : "");
  vk_.emplace(vki_, device_);
  vk_->vkGetDeviceQueue(device_, physical.queue_family, 0, &queue_);

  VkCommandPoolCreateInfo pool = {};
  pool.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = physical.queue_family;
  check(vk_->vkCreateCommandPool(device_, &pool, nullptr, &pool_), kWork,
        "vkCreateCommandPool(device %u, queue family %u)", index_, physical.queue_family);
  std::vector<VkCommandBuffer> buffers(kCommandBuffers);
  VkCommandBufferAllocateInfo allocate = {};
  allocate.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
  allocate.commandPool = pool_;
  allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  allocate.commandBufferCount = kCommandBuffers;
  check(vk_->vkAllocateCommandBuffers(device_, &allocate, buffers.data()), kWork,
        "vkAllocateCommandBuffers(device %u, count = %u)", index_, kCommandBuffers);
  for (VkCommandBuffer b : buffers) slots_.push_back(CommandSlot{b, 0});

  VkSemaphoreTypeCreateInfo type = {};
  type.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO;
  type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  type.initialValue = 0;
  VkSemaphoreCreateInfo semaphore = {};
  semaphore.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO;
  semaphore.pNext = &type;
  check(vk_->vkCreateSemaphore(device_, &semaphore, nullptr, &timeline_), kWork,
        "vkCreateSemaphore(device %u, VK_SEMAPHORE_TYPE_TIMELINE)", index_);
}

void VulkanDevice::choose_memory_types(const VkPhysicalDeviceMemoryProperties& memory) {
  // Which types a buffer of each use may live in (the same for every
  // buffer of that use and create flags), from a probe buffer.
  auto allowed_types = [&](VkBufferUsageFlags usage) {
    VkBufferCreateInfo info = {};
    info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    info.size = kNaturalAlignment;
    info.usage = usage;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkBuffer probe = VK_NULL_HANDLE;
    check(vk_->vkCreateBuffer(device_, &info, nullptr, &probe), kWork,
          "vkCreateBuffer(device %u, probe of %u bytes, usage = 0x%x)", index_,
          static_cast<unsigned>(kNaturalAlignment), usage);
    VkMemoryRequirements needs = {};
    vk_->vkGetBufferMemoryRequirements(device_, probe, &needs);
    vk_->vkDestroyBuffer(device_, probe, nullptr);
    return needs.memoryTypeBits;
  };
  const VkBufferUsageFlags device_usage =
      kTransfer | (device_addresses_ ? VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT : 0);
  const uint32_t device_bits = allowed_types(device_usage);
  const uint32_t host_bits = allowed_types(kTransfer);

  // Device memory: a DEVICE_LOCAL type of the largest device-local heap;
  // one that is also host-visible and coherent when that heap has one (all
  // memory on lavapipe and integrated GPUs, resizable BAR on discrete ones),
  // not when it lives on a small heap of its own (a 256 MiB BAR window).
  uint64_t largest = 0;
  for (uint32_t t = 0; t < memory.memoryTypeCount; ++t) {
    const VkMemoryType& type = memory.memoryTypes[t];
    if ((device_bits & (1u << t)) && (type.propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) {
      largest = std::max(largest, memory.memoryHeaps[type.heapIndex].size);
    }
  }
  int best = -1;
  int best_rank = -1;
  for (uint32_t t = 0; t < memory.memoryTypeCount; ++t) {
    const VkMemoryType& type = memory.memoryTypes[t];
    const VkMemoryPropertyFlags f = type.propertyFlags;
    if (!(device_bits & (1u << t)) || !(f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) ||
        memory.memoryHeaps[type.heapIndex].size != largest) {
      continue;
    }
    const int rank = (f & kHostVisible) ? ((f & kHostCoherent) ? 2 : 1) : 0;
    if (rank > best_rank) {
      best = static_cast<int>(t);
      best_rank = rank;
    }
  }
  if (best < 0) {
    throw Failure{kDeviceError,
                  plugin::format("device %u (%s) has no DEVICE_LOCAL memory type for transfer "
                                 "buffers (memoryTypeBits 0x%x)",
                                 index_, description_.name.c_str(), device_bits)};
  }
  device_memory_type_ = static_cast<uint32_t>(best);
  device_memory_flags_ = memory.memoryTypes[best].propertyFlags;
  // No single allocation can exceed its heap: larger requests are refused
  // before Vulkan sees them (a size past the heap is invalid usage, which
  // a driver need not answer with an error).
  device_heap_bytes_ = largest;

  // Staging and bounce memory: host-visible and coherent.
  int host = -1;
  for (uint32_t t = 0; t < memory.memoryTypeCount && host < 0; ++t) {
    const VkMemoryPropertyFlags f = memory.memoryTypes[t].propertyFlags;
    if ((host_bits & (1u << t)) && (f & kHostVisible) && (f & kHostCoherent)) {
      host = static_cast<int>(t);
    }
  }
  if (host < 0) {
    throw Failure{kDeviceError,
                  plugin::format("device %u (%s) has no HOST_VISIBLE | HOST_COHERENT memory "
                                 "type for transfer buffers (memoryTypeBits 0x%x)",
                                 index_, description_.name.c_str(), host_bits)};
  }
  host_memory_type_ = static_cast<uint32_t>(host);
}

VulkanDevice::~VulkanDevice() {
  quiesce();
  // Every release has fired and nothing will be pushed: the worker ends.
  fences_.reset();
  destroy_objects();
}

void VulkanDevice::quiesce() noexcept {
  const uint64_t value = last_submitted();
  try {
    wait_value(value);
  } catch (...) {
    // Lost: nothing it submitted runs any more.
  }
  if (fences_) fences_->wait_for(value);
}

void VulkanDevice::destroy_objects() noexcept {
  if (device_ == VK_NULL_HANDLE) return;
  if (vk_) {
    // Whatever is still queued (nothing, unless the device is lost) ends
    // before its buffers go.
    static_cast<void>(vk_->vkDeviceWaitIdle(device_));
    for (auto& [address, allocation] : allocations_) {
      addresses_->release(description_.uuid, address);
      destroy_buffer(*vk_, device_, allocation.buffer);
    }
    allocations_.clear();
    mappings_.clear();
    for (auto& [host, buffer] : staging_) destroy_buffer(*vk_, device_, buffer);
    staging_.clear();
    for (Chunk& chunk : chunks_) destroy_buffer(*vk_, device_, chunk.buffer);
    chunks_.clear();
    cache_.reset();
    // Destroying the pool frees its command buffers.
    if (pool_ != VK_NULL_HANDLE) vk_->vkDestroyCommandPool(device_, pool_, nullptr);
    slots_.clear();
    if (timeline_ != VK_NULL_HANDLE) vk_->vkDestroySemaphore(device_, timeline_, nullptr);
    vk_->vkDestroyDevice(device_, nullptr);
  }
  pool_ = VK_NULL_HANDLE;
  timeline_ = VK_NULL_HANDLE;
  device_ = VK_NULL_HANDLE;
}

plugin::MemoryInfo VulkanDevice::memory_info() const {
  require_alive();
  const uint64_t total = description_.total_memory_bytes;
  if (!has_memory_budget_) {
    // No budget from the driver: what this instance has not allocated.
    const uint64_t used = std::min<uint64_t>(used_bytes_, total);
    return plugin::MemoryInfo{total - used, total};
  }
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget = {};
  budget.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT;
  VkPhysicalDeviceMemoryProperties2 memory = {};
  memory.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2;
  memory.pNext = &budget;
  vki_.vkGetPhysicalDeviceMemoryProperties2(physical_, &memory);
  // The driver counts cached buffers as used; they are this plugin's to
  // give back, so free (PLUGIN-10).
  uint64_t free = cache_->bytes();
  const auto& heaps = memory.memoryProperties;
  for (uint32_t h = 0; h < heaps.memoryHeapCount; ++h) {
    if (heaps.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      const uint64_t b = budget.heapBudget[h];
      const uint64_t u = budget.heapUsage[h];
      free += b > u ? b - u : 0;
    }
  }
  return plugin::MemoryInfo{std::min(free, total), total};
}

void VulkanDevice::mark_lost(const char* answered) const noexcept {
  const char* none = nullptr;
  lost_by_.compare_exchange_strong(none, answered);
  lost_ = true;
}

void VulkanDevice::require_alive() const {
  if (!lost_) return;
  const char* answered = lost_by_.load();
  throw Failure{kDeviceError, plugin::format("device %u is lost (%s answered VK_ERROR_DEVICE_LOST)",
                                             index_, answered != nullptr ? answered : "a call")};
}

uint64_t VulkanDevice::last_submitted() {
  std::lock_guard lock(submit_mutex_);
  return last_value_;
}

void VulkanDevice::wait_value(uint64_t value) const {
  if (value == 0) return;
  VkSemaphoreWaitInfo info = {};
  info.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO;
  info.semaphoreCount = 1;
  info.pSemaphores = &timeline_;
  info.pValues = &value;
  VkResult r = vk_->vkWaitSemaphores(device_, &info, UINT64_MAX);
  // A failed wait says nothing of the work, which may still read its
  // source: the timeline is asked again until it has reached the value or
  // the device is lost. A device that never ends the work and never reports
  // itself lost keeps this waiting, as vkDeviceWaitIdle would.
  auto pause = kFirstPoll;
  const char* answered = "vkWaitSemaphores";
  while (r != VK_SUCCESS && r != VK_ERROR_DEVICE_LOST) {
    uint64_t reached = 0;
    r = vk_->vkGetSemaphoreCounterValue(device_, timeline_, &reached);
    answered = "vkGetSemaphoreCounterValue";
    if (r == VK_SUCCESS && reached >= value) break;
    if (r == VK_ERROR_DEVICE_LOST) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kLongestPoll);
    r = vk_->vkWaitSemaphores(device_, &info, UINT64_MAX);
    answered = "vkWaitSemaphores";
  }
  if (r == VK_ERROR_DEVICE_LOST) mark_lost(answered);
  check(r, kWork, "%s(device %u, timeline value %" PRIu64 ")", answered, index_, value);
}

std::map<uint64_t, VulkanDevice::Allocation>::iterator VulkanDevice::find(uint64_t address,
                                                                          uint64_t nbytes,
                                                                          const char* role,
                                                                          const char* rule) {
  auto it = allocations_.upper_bound(address);
  if (it != allocations_.begin()) {
    --it;
    const uint64_t offset = address - it->first;
    if (offset <= it->second.nbytes && nbytes <= it->second.nbytes - offset) return it;
  }
  throw Failure{kInvalid, plugin::format("%s [0x%" PRIx64 ", +%" PRIu64
                                         ") is not inside a live allocation of this device (%s)",
                                         role, address, nbytes, rule)};
}

VulkanDevice::Located VulkanDevice::locate(uint64_t address, uint64_t nbytes, const char* role) {
  std::lock_guard lock(allocations_mutex_);
  const auto it = find(address, nbytes, role, "PLUGIN-15");
  return Located{it->second.buffer.buffer, address - it->second.base};
}

std::optional<VulkanDevice::Located> VulkanDevice::staged(const void* src, uint64_t nbytes) {
  std::lock_guard lock(allocations_mutex_);
  auto it = staging_.upper_bound(src);
  if (it == staging_.begin()) return std::nullopt;
  --it;
  const uint64_t offset = address_of(src) - address_of(it->first);
  if (offset > it->second.size || nbytes > it->second.size - offset) return std::nullopt;
  return Located{it->second.buffer, offset};
}

uint64_t VulkanDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  require_alive();
  BufferRequest request;
  request.usage = kTransfer;
  request.memory_type = device_memory_type_;
  request.map = mappable();
  request.device_address = device_addresses_;
  request.device_index = index_;
  // Room to align the address handed out inside the buffer: a device
  // address is aligned to what the driver chose; a window to 64 KiB.
  request.size =
      plugin::over_allocation(nbytes, alignment, device_addresses_ ? 1 : kWindowAlignment);
  if (request.size > device_heap_bytes_) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                  plugin::format("%" PRIu64 " bytes exceed the %" PRIu64
                                 "-byte memory heap of device %u",
                                 request.size, device_heap_bytes_, index_)};
  }
  const std::optional<BufferCache::Entry> cached =
      cache_->take(nbytes, alignment, request.size);
  BufferCache::Entry entry = cached ? *cached : BufferCache::Entry{create_device_buffer(request)};
  Buffer& buffer = entry.buffer;
  uint64_t address = 0;
  try {
    // A cached buffer keeps its base (its device address, or its window).
    if (!cached) {
      entry.base =
          device_addresses_ ? buffer.device_address : addresses_->reserve_window(request.size);
    }
    address = plugin::align_up(entry.base, alignment);
    addresses_->claim(
        description_.uuid, address, nbytes,
        device_addresses_
            ? plugin::format("vkGetBufferDeviceAddress(device %u, size = %" PRIu64 ")", index_,
                             request.size)
            : std::string("the address window counter"));
  } catch (...) {
    destroy_buffer(*vk_, device_, buffer);
    throw;
  }
  try {
    std::lock_guard lock(allocations_mutex_);
    allocations_.emplace(address, Allocation{buffer, entry.base, nbytes});
  } catch (...) {
    addresses_->release(description_.uuid, address);
    destroy_buffer(*vk_, device_, buffer);
    throw;
  }
  used_bytes_ += nbytes;
  return address;
}

void VulkanDevice::deallocate(uint64_t address) {
  Allocation allocation;
  {
    std::lock_guard lock(allocations_mutex_);
    auto it = allocations_.find(address);
    if (it == allocations_.end()) {
      throw Failure{kInvalid, plugin::format("0x%" PRIx64 " is not a live allocation of this "
                                             "device (PLUGIN-12)",
                                             address)};
    }
    allocation = it->second;
    allocations_.erase(it);
    // Its mappings end with it (PLUGIN-22).
    for (auto m = mappings_.begin(); m != mappings_.end();) {
      m = m->second.allocation == address ? mappings_.erase(m) : std::next(m);
    }
  }
  // A copy still queued may use the buffer (a host that frees before it
  // synchronized): destroying it under the copy is undefined behaviour in
  // Vulkan, so whatever was submitted ends first.
  try {
    wait_value(last_submitted());
  } catch (...) {
    // Lost: nothing runs any more.
  }
  // The claim goes first: once the memory is freed (or cached) another
  // thread's allocate may hand the same address out at once. The ABI
  // promises nothing of a new allocation's bytes (PLUGIN-11): a cached
  // buffer is not cleared.
  addresses_->release(description_.uuid, address);
  cache_->keep(BufferCache::Entry{allocation.buffer, allocation.base});
  used_bytes_ -= allocation.nbytes;
}

Buffer VulkanDevice::create_device_buffer(const BufferRequest& request) {
  try {
    return create_buffer(*vk_, device_, request);
  } catch (const Failure& failure) {
    if (failure.status != DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY || !cache_->release_all()) throw;
  }
  return create_buffer(*vk_, device_, request);
}

void* VulkanDevice::map_to_host(uint64_t address, uint64_t nbytes) {
  require_alive();
  if (!mappable()) {
    throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                  plugin::format("device %u (%s): its device memory (type %u) is not "
                                 "HOST_VISIBLE",
                                 index_, description_.name.c_str(), device_memory_type_)};
  }
  std::lock_guard lock(allocations_mutex_);
  const auto it = find(address, nbytes, "the range", "PLUGIN-22");
  const uint64_t offset = address - it->second.base;
  if ((device_memory_flags_ & kHostCoherent) == 0) {
    // The device's writes become visible to the host's reads: the range
    // alone, widened to whole atoms, so that another live mapping's
    // unflushed writes elsewhere in the allocation are not invalidated.
    VkMappedMemoryRange range = {};
    range.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE;
    range.memory = it->second.buffer.memory;
    range.offset = offset / non_coherent_atom_ * non_coherent_atom_;
    const uint64_t end = plugin::align_up(offset + nbytes, non_coherent_atom_);
    range.size = end >= it->second.buffer.size ? VK_WHOLE_SIZE : end - range.offset;
    check(vk_->vkInvalidateMappedMemoryRanges(device_, 1, &range), kWork,
          "vkInvalidateMappedMemoryRanges(device %u, allocation 0x%" PRIx64 ")", index_, address);
  }
  void* host = static_cast<char*>(it->second.buffer.mapped) + offset;
  mappings_.emplace(host, Mapping{it->first, offset, nbytes});
  return host;
}

void VulkanDevice::unmap_from_host(void* host) {
  std::lock_guard lock(allocations_mutex_);
  const auto m = mappings_.find(host);
  if (m == mappings_.end()) {
    throw Failure{kInvalid, plugin::format("%p is not a live mapping of device %u (PLUGIN-22)",
                                           host, index_)};
  }
  const Mapping mapping = m->second;
  mappings_.erase(m);
  if ((device_memory_flags_ & kHostCoherent) != 0) return;
  // The host's writes reach the device: the range, widened to whole atoms.
  const Allocation& allocation = allocations_.at(mapping.allocation);
  VkMappedMemoryRange range = {};
  range.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE;
  range.memory = allocation.buffer.memory;
  range.offset = mapping.offset / non_coherent_atom_ * non_coherent_atom_;
  const uint64_t end = plugin::align_up(mapping.offset + mapping.nbytes, non_coherent_atom_);
  range.size = end >= allocation.buffer.size ? VK_WHOLE_SIZE : end - range.offset;
  require_alive();
  check(vk_->vkFlushMappedMemoryRanges(device_, 1, &range), kWork,
        "vkFlushMappedMemoryRanges(device %u, offset = %" PRIu64 ", size = %" PRIu64 ")", index_,
        range.offset, range.size);
}

void* VulkanDevice::allocate_staging(uint64_t nbytes) {
  require_alive();
  BufferRequest request;
  request.size = nbytes;
  request.usage = kTransfer;
  request.memory_type = host_memory_type_;
  request.map = true;
  request.kind = CallKind::host_allocation;
  request.device_index = index_;
  Buffer buffer = create_buffer(*vk_, device_, request);
  try {
    std::lock_guard lock(allocations_mutex_);
    staging_.emplace(buffer.mapped, buffer);
  } catch (...) {
    destroy_buffer(*vk_, device_, buffer);
    throw;
  }
  return buffer.mapped;
}

void VulkanDevice::free_staging(void* host) {
  Buffer buffer;
  {
    std::lock_guard lock(allocations_mutex_);
    auto it = staging_.find(host);
    if (it == staging_.end()) {
      throw Failure{kInvalid,
                    plugin::format("%p is not a live buffer from allocate_host (PLUGIN-18)", host)};
    }
    buffer = it->second;
    staging_.erase(it);
  }
  // A copy still queued may read it (a host that frees before the release).
  try {
    wait_value(last_submitted());
  } catch (...) {
    // Lost: nothing runs any more.
  }
  destroy_buffer(*vk_, device_, buffer);
}

uint64_t VulkanDevice::submit_copy(VkBuffer src, VkBuffer dst, const VkBufferCopy& region,
                                   plugin::Release&& release, const char* what) {
  require_alive();
  CommandSlot& slot = slots_[next_slot_];
  // Its previous submission is over before it is recorded again.
  wait_value(slot.value);
  VkCommandBuffer cb = slot.buffer;
  check(vk_->vkResetCommandBuffer(cb, 0), kWork, "vkResetCommandBuffer(device %u)", index_);
  VkCommandBufferBeginInfo begin = {};
  begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vk_->vkBeginCommandBuffer(cb, &begin), kWork, "vkBeginCommandBuffer(device %u)", index_);
  // Submissions on one queue may overlap: each copy starts after the copies
  // submitted before it (a read after their writes, a write after theirs),
  // and its writes are made visible to the host, which reads bounce chunks
  // and mappings once the value is reached.
  VkMemoryBarrier before = {};
  before.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  before.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  before.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  vk_->vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0,
                            1, &before, 0, nullptr, 0, nullptr);
  vk_->vkCmdCopyBuffer(cb, src, dst, 1, &region);
  VkMemoryBarrier after = {};
  after.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  after.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  after.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vk_->vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                            &after, 0, nullptr, 0, nullptr);
  check(vk_->vkEndCommandBuffer(cb), kWork, "vkEndCommandBuffer(device %u)", index_);

  const uint64_t value = last_value_ + 1;
  VkTimelineSemaphoreSubmitInfo timeline = {};
  timeline.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
  timeline.signalSemaphoreValueCount = 1;
  timeline.pSignalSemaphoreValues = &value;
  VkSubmitInfo submit = {};
  submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
  submit.pNext = &timeline;
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &cb;
  submit.signalSemaphoreCount = 1;
  submit.pSignalSemaphores = &timeline_;
  const VkResult r = vk_->vkQueueSubmit(queue_, 1, &submit, VK_NULL_HANDLE);
  if (r == VK_ERROR_DEVICE_LOST) mark_lost("vkQueueSubmit");
  check(r, kWork,
        "vkQueueSubmit(device %u, vkCmdCopyBuffer %s, srcOffset = %" PRIu64 ", dstOffset = %" PRIu64
        ", size = %" PRIu64 ", signal value %" PRIu64 ")",
        index_, what, region.srcOffset, region.dstOffset, region.size, value);
  last_value_ = value;
  slot.value = value;
  next_slot_ = (next_slot_ + 1) % kCommandBuffers;
  if (release) {
    try {
      fences_->push(value, index_, std::move(release));
    } catch (...) {
      // The copy may read its source until the value: the caller's
      // release fires once that is over.
      try {
        wait_value(value);
      } catch (...) {
        // Lost: nothing reads the source any more.
      }
      throw;
    }
  }
  return value;
}

VulkanDevice::Chunk& VulkanDevice::next_chunk() {
  if (chunks_.size() < kBounceChunks) {
    BufferRequest request;
    request.size = kBounceChunkBytes;
    request.usage = kTransfer;
    request.memory_type = host_memory_type_;
    request.map = true;
    request.kind = CallKind::host_allocation;
    request.device_index = index_;
    chunks_.push_back(Chunk{});
    try {
      chunks_.back().buffer = create_buffer(*vk_, device_, request);
    } catch (...) {
      chunks_.pop_back();
      throw;
    }
    next_chunk_ = static_cast<uint32_t>(chunks_.size() - 1);
  }
  Chunk& chunk = chunks_[next_chunk_];
  next_chunk_ = (next_chunk_ + 1) % kBounceChunks;
  // The copy that read it before is over (PLUGIN-25: submitted work only).
  wait_value(chunk.value);
  return chunk;
}

uint64_t VulkanDevice::bounce_to_device(const Located& dst, const void* src, uint64_t nbytes) {
  uint64_t value = 0;
  for (uint64_t done = 0; done < nbytes;) {
    const uint64_t piece = std::min(kBounceChunkBytes, nbytes - done);
    Chunk& chunk = next_chunk();
    // The host's write to coherent memory is visible to the queue once
    // the copy is submitted.
    std::memcpy(chunk.buffer.mapped, static_cast<const char*>(src) + done, piece);
    value = submit_copy(chunk.buffer.buffer, dst.buffer, VkBufferCopy{0, dst.offset + done, piece},
                        plugin::Release{}, "host to device (bounced)");
    chunk.value = value;
    done += piece;
  }
  return value;
}

void VulkanDevice::copy_during_call(uint64_t dst, const void* src, uint64_t nbytes) {
  require_alive();
  const Located to = locate(dst, nbytes, "the destination");
  const std::optional<Located> from = staged(src, nbytes);
  uint64_t value = 0;
  {
    std::lock_guard lock(submit_mutex_);
    value =
        from ? submit_copy(from->buffer, to.buffer, VkBufferCopy{from->offset, to.offset, nbytes},
                           plugin::Release{}, "host to device")
             : bounce_to_device(to, src, nbytes);
  }
  wait_value(value);
}

void VulkanDevice::copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                                       plugin::Release release) {
  require_alive();
  const Located to = locate(dst, nbytes, "the destination");
  if (const std::optional<Located> from = staged(src, nbytes)) {
    // Read in place by the copy: released once its value is reached.
    std::lock_guard lock(submit_mutex_);
    submit_copy(from->buffer, to.buffer, VkBufferCopy{from->offset, to.offset, nbytes},
                std::move(release), "host to device");
    return;
  }
  {
    std::lock_guard lock(submit_mutex_);
    bounce_to_device(to, src, nbytes);
  }
  // The memcpy into the chunks was the read of src.
  release.fire();
}

void VulkanDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  require_alive();
  const Located from = locate(src, nbytes, "the source");
  std::lock_guard lock(submit_mutex_);
  // Each piece's copy starts after every copy submitted before it
  // (submit_copy's barrier), so the bytes are those of earlier copies.
  for (uint64_t done = 0; done < nbytes;) {
    const uint64_t piece = std::min(kBounceChunkBytes, nbytes - done);
    Chunk& chunk = next_chunk();
    chunk.value =
        submit_copy(from.buffer, chunk.buffer.buffer, VkBufferCopy{from.offset + done, 0, piece},
                    plugin::Release{}, "device to host");
    wait_value(chunk.value);
    std::memcpy(static_cast<char*>(dst) + done, chunk.buffer.mapped, piece);
    done += piece;
  }
}

void VulkanDevice::synchronize() {
  const uint64_t value = last_submitted();
  std::optional<Failure> failed;
  try {
    wait_value(value);
  } catch (Failure& f) {
    failed = std::move(f);
  }
  fences_->wait_for(value);
  if (failed) throw *failed;
  require_alive();
  if (auto error = fences_->take_error(index_)) {
    throw Failure{kDeviceError, "an earlier copy failed: " + *error};
  }
}

}  // namespace devalloc::vulkan
