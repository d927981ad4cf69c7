// The Vulkan plugin as a kit plugin: the loader opened at run time, one
// VkInstance (API 1.2 or later), every physical device of 1.2 or later
// with a queue family that can transfer, and staging memory from the one
// device when there is one.
#include <algorithm>
#include <devalloc/plugin_kit/device_instance.hpp>
#include <devalloc/plugin_kit/plugin_entry.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vk_device.hpp"
#include "vk_runtime.hpp"

#ifndef DEVALLOC_VULKAN_PLUGIN_VERSION
#error "DEVALLOC_VULKAN_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::vulkan {
namespace {

using plugin::CallKind;
using plugin::Failure;

constexpr const char* kPluginName = "vulkan";

// A family that can run vkCmdCopyBuffer (TRANSFER, GRAPHICS or COMPUTE),
// preferring a transfer-only one (a DMA engine); none if it has none.
std::optional<uint32_t> transfer_family(const InstanceFunctions& vki, VkPhysicalDevice device) {
  uint32_t count = 0;
  vki.vkGetPhysicalDeviceQueueFamilyProperties(device, &count, nullptr);
  std::vector<VkQueueFamilyProperties> families(count);
  vki.vkGetPhysicalDeviceQueueFamilyProperties(device, &count, families.data());
  constexpr VkQueueFlags kEngines = VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT;
  std::optional<uint32_t> chosen;
  for (uint32_t i = 0; i < count; ++i) {
    const VkQueueFlags f = families[i].queueFlags;
    if (families[i].queueCount == 0 || (f & (kEngines | VK_QUEUE_TRANSFER_BIT)) == 0) continue;
    if ((f & kEngines) == 0) return i;
    if (!chosen) chosen = i;
  }
  return chosen;
}

// A base before the devices, so that the loader and the VkInstance exist
// before them and are destroyed after them, also when a constructor throws.
class VulkanContext {
 public:
  explicit VulkanContext(const std::string& library) : loader_(library) {
    uint32_t version = 0;
    check(loader_.vkEnumerateInstanceVersion(&version), CallKind::work,
          "vkEnumerateInstanceVersion");
    if (version < VK_API_VERSION_1_2) {
      throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                    plugin::format("the Vulkan loader %s offers API %u.%u; timeline semaphores "
                                   "need 1.2",
                                   loader_.library.path().c_str(), VK_API_VERSION_MAJOR(version),
                                   VK_API_VERSION_MINOR(version))};
    }
    VkApplicationInfo app = {};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "devalloc";
    app.pEngineName = "devalloc";
    app.apiVersion = std::min<uint32_t>(version, VK_API_VERSION_1_3);
    VkInstanceCreateInfo info = {};
    info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    info.pApplicationInfo = &app;
    const std::vector<std::string> before = plugin::loaded_objects();
    check(loader_.vkCreateInstance(&info, nullptr, &instance_), CallKind::work,
          "vkCreateInstance(apiVersion = %u.%u)", VK_API_VERSION_MAJOR(app.apiVersion),
          VK_API_VERSION_MINOR(app.apiVersion));
    // The drivers the loader opened stay loaded when this instance goes:
    // lavapipe keeps memory per device that only its globals reach.
    plugin::keep_loaded_since(before);
    try {
      vki_.emplace(loader_, instance_);
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~VulkanContext() { destroy(); }
  VulkanContext(const VulkanContext&) = delete;
  VulkanContext& operator=(const VulkanContext&) = delete;

 protected:
  std::vector<std::unique_ptr<VulkanDevice>> open_devices(const DeviceSettings& settings) const {
    uint32_t count = 0;
    check(vki_->vkEnumeratePhysicalDevices(instance_, &count, nullptr), CallKind::work,
          "vkEnumeratePhysicalDevices(count)");
    std::vector<VkPhysicalDevice> handles(count);
    // VK_INCOMPLETE cannot come: the count was just read, and physical
    // devices do not come and go within an instance.
    check(vki_->vkEnumeratePhysicalDevices(instance_, &count, handles.data()), CallKind::work,
          "vkEnumeratePhysicalDevices(%u)", count);
    handles.resize(count);
    std::vector<std::unique_ptr<VulkanDevice>> devices;
    for (VkPhysicalDevice handle : handles) {
      VkPhysicalDeviceProperties properties = {};
      vki_->vkGetPhysicalDeviceProperties(handle, &properties);
      if (properties.apiVersion < VK_API_VERSION_1_2) continue;
      const std::optional<uint32_t> family = transfer_family(*vki_, handle);
      if (!family) continue;
      devices.push_back(std::make_unique<VulkanDevice>(
          *vki_, PhysicalDevice{handle, *family}, static_cast<uint32_t>(devices.size()),
          settings));
    }
    return devices;
  }

 private:
  void destroy() noexcept {
    if (instance_ != VK_NULL_HANDLE && vki_) vki_->vkDestroyInstance(instance_, nullptr);
    instance_ = VK_NULL_HANDLE;
  }

  Loader loader_;
  VkInstance instance_ = VK_NULL_HANDLE;
  std::optional<InstanceFunctions> vki_;
};

class VulkanInstance final : private VulkanContext, public plugin::DeviceInstance<VulkanDevice> {
 public:
  VulkanInstance(const std::string& library, const DeviceSettings& settings)
      : VulkanContext(library), DeviceInstance(open_devices(settings)) {}

  ~VulkanInstance() override {
    // Staging memory may be the source of copies still in flight; each
    // device frees its own staging buffers once its work is over.
    quiesce_devices();
    devices_.clear();
  }

  uint64_t capability_flags() const override {
    uint64_t flags = DEVALLOC_CAPABILITY_ASYNC_COPY;
    // A staging buffer is a VkBuffer of one VkDevice, and allocate_host
    // names no device: offered when there is one device.
    if (devices_.size() == 1) flags |= DEVALLOC_CAPABILITY_HOST_STAGING;
    const bool mappable =
        !devices_.empty() &&
        std::all_of(devices_.begin(), devices_.end(), [](const auto& d) { return d->mappable(); });
    if (mappable) flags |= DEVALLOC_CAPABILITY_HOST_MAPPABLE;
    return flags;
  }

  void* allocate_host(uint64_t nbytes) override {
    return staging_device().allocate_staging(nbytes);
  }
  void free_host(void* host) override { staging_device().free_staging(host); }

  void* map_to_host(uint32_t device, uint64_t address, uint64_t nbytes) override {
    return devices_[device]->map_to_host(address, nbytes);
  }
  void unmap_from_host(uint32_t device, void* host) override {
    devices_[device]->unmap_from_host(host);
  }

 private:
  VulkanDevice& staging_device() {
    if (devices_.size() != 1) {
      throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                    plugin::format("host staging memory is a VkBuffer of one VkDevice, and this "
                                   "instance has %zu devices",
                                   devices_.size())};
    }
    return *devices_.front();
  }
};

AddressModel take_address_model(plugin::Options& options) {
  std::string text;
  if (!options.take("address_model", text) || text == "buffer_device_address") {
    return AddressModel::buffer_device_address;
  }
  if (text == "window") return AddressModel::window;
  throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                plugin::format("vulkan: option address_model = \"%s\" is neither "
                               "\"buffer_device_address\" nor \"window\"",
                               text.c_str())};
}

struct VulkanPlugin {
  static constexpr const char* name = kPluginName;
  static constexpr const char* version = DEVALLOC_VULKAN_PLUGIN_VERSION;
  // VK_EXT_memory_budget where the device has it, else what this instance
  // has not allocated (VulkanDevice::memory_info).
  static constexpr bool offers_memory_info = true;
  static constexpr bool offers_host_mapping = true;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    DeviceSettings settings;
    settings.address_model = take_address_model(options);
    settings.cache_bytes = options.take_u64("cache_bytes", settings.cache_bytes);
    std::string library = "libvulkan.so.1";
    if (options.take("runtime_library", library) && library.empty()) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "vulkan: option runtime_library is empty"};
    }
    options.reject_unknown(name, "runtime_library, address_model, cache_bytes");
    // Whatever fails while the runtime is set up makes the plugin
    // unavailable, in the runtime's own words.
    try {
      return std::make_unique<VulkanInstance>(library, settings);
    } catch (Failure& failure) {
      failure.status = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE;
      failure.message.insert(0, std::string(name) + ": ");
      throw;
    }
  }
};

}  // namespace
}  // namespace devalloc::vulkan

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::vulkan::VulkanPlugin)
