// The Level Zero plugin as a kit plugin: the loader opened at run time, one
// context per driver, the GPU devices of every driver, and host (staging)
// memory from zeMemAllocHost when every device shares one context.
#include <algorithm>
#include <cinttypes>
#include <devalloc/plugin_kit/device_instance.hpp>
#include <devalloc/plugin_kit/give_back.hpp>
#include <devalloc/plugin_kit/plugin_entry.hpp>
#include <memory>
#include <string>
#include <vector>

#include "ze_device.hpp"
#include "ze_runtime.hpp"

#ifndef DEVALLOC_LEVEL_ZERO_PLUGIN_VERSION
#error "DEVALLOC_LEVEL_ZERO_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::level_zero {
namespace {

using plugin::CallKind;
using plugin::Failure;
using plugin::give_back;

// A base before the devices, so that the loader and the contexts exist
// before them and are closed after them, also when a constructor throws.
class Contexts {
 public:
  struct Driver {
    ze_context_handle_t context = nullptr;
    std::vector<ze_device_handle_t> devices;
  };

  explicit Contexts(const std::string& library);
  ~Contexts() { destroy(); }
  Contexts(const Contexts&) = delete;
  Contexts& operator=(const Contexts&) = delete;

 protected:
  std::vector<std::unique_ptr<ZeDevice>> open_devices() const;

  Runtime ze_;
  // Drivers that have GPU devices, each with its context.
  std::vector<Driver> drivers_;

 private:
  void destroy() noexcept {
    for (const Driver& driver : drivers_) {
      give_back([&] { return ze_.zeContextDestroy(driver.context); });
    }
    drivers_.clear();
  }
};

Contexts::Contexts(const std::string& library) : ze_(library) {
  // Without a driver (none installed, or none that found its hardware) the
  // loader answers ZE_RESULT_ERROR_UNINITIALIZED: the runtime cannot serve,
  // and its own words say why.
  ze_.check(ze_.zeInit(0), CallKind::work, "zeInit(0)");
  uint32_t count = 0;
  ze_.check(ze_.zeDriverGet(&count, nullptr), CallKind::work, "zeDriverGet(count)");
  std::vector<ze_driver_handle_t> handles(count);
  ze_.check(ze_.zeDriverGet(&count, handles.data()), CallKind::work, "zeDriverGet(%u)", count);
  handles.resize(count);
  try {
    for (size_t d = 0; d < handles.size(); ++d) {
      uint32_t n = 0;
      ze_.check(ze_.zeDeviceGet(handles[d], &n, nullptr), CallKind::work,
                "zeDeviceGet(driver %zu, count)", d);
      if (n == 0) continue;
      std::vector<ze_device_handle_t> all(n);
      ze_.check(ze_.zeDeviceGet(handles[d], &n, all.data()), CallKind::work,
                "zeDeviceGet(driver %zu)", d);
      all.resize(n);
      // zeInit(0) initializes every driver, also an NPU's (and zeInit is
      // the process's: narrowing it with ZE_INIT_FLAG_GPU_ONLY could hide
      // drivers from other code of the process), so the device type
      // decides. Device indices count GPU devices only.
      Driver driver;
      for (uint32_t i = 0; i < n; ++i) {
        ze_device_properties_t properties = {};
        properties.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
        ze_.check(ze_.zeDeviceGetProperties(all[i], &properties), CallKind::work,
                  "zeDeviceGetProperties(driver %zu, device %u)", d, i);
        if (properties.type == ZE_DEVICE_TYPE_GPU) driver.devices.push_back(all[i]);
      }
      if (driver.devices.empty()) continue;
      ze_context_desc_t desc = {};
      desc.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
      ze_.check(ze_.zeContextCreate(handles[d], &desc, &driver.context), CallKind::work,
                "zeContextCreate(driver %zu)", d);
      drivers_.push_back(std::move(driver));
    }
  } catch (...) {
    destroy();
    throw;
  }
}

std::vector<std::unique_ptr<ZeDevice>> Contexts::open_devices() const {
  std::vector<std::unique_ptr<ZeDevice>> devices;
  for (const Driver& driver : drivers_) {
    for (ze_device_handle_t device : driver.devices) {
      devices.push_back(std::make_unique<ZeDevice>(ze_, driver.context, device,
                                                   static_cast<uint32_t>(devices.size())));
    }
  }
  return devices;
}

class LevelZeroInstance final : private Contexts, public plugin::DeviceInstance<ZeDevice> {
 public:
  explicit LevelZeroInstance(const std::string& library)
      : Contexts(library), DeviceInstance(open_devices()) {}

  ~LevelZeroInstance() override {
    // Staging memory may be the source of copies still in flight.
    quiesce_devices();
    staging_.for_each([this](void* host, uint64_t) {
      give_back([&] { return ze_.zeMemFree(staging_context(), host); });
    });
    staging_.clear();
    devices_.clear();
  }

  uint64_t capability_flags() const override {
    uint64_t flags = DEVALLOC_CAPABILITY_ASYNC_COPY;
    if (drivers_.size() == 1) flags |= DEVALLOC_CAPABILITY_HOST_STAGING;
    return flags;
  }

  void* allocate_host(uint64_t nbytes) override {
    // Host memory belongs to one context and may only be copied by command
    // lists of that context; allocate_host names no device, and the host
    // uses one staging buffer for every device of the plugin. So staging
    // memory is offered only when every device shares one context: when
    // the devices come from one driver.
    if (drivers_.empty()) {
      throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                    "host memory needs a Level Zero context, and this instance has no device"};
    }
    if (drivers_.size() > 1) {
      throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                    plugin::format("host staging memory belongs to one Level Zero context, and "
                                   "this instance's devices come from %zu drivers, each with its "
                                   "own context",
                                   drivers_.size())};
    }
    ze_host_mem_alloc_desc_t desc = {};
    desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
    // Host memory, too, is limited by maxMemAllocSize: the smallest of the
    // devices that may copy it.
    uint64_t max_allocation = UINT64_MAX;
    for (const auto& device : devices_) {
      max_allocation = std::min(max_allocation, device->max_allocation());
    }
    RelaxedLimits relaxed(nbytes, max_allocation);
    desc.pNext = relaxed.chain();
    void* host = nullptr;
    const std::string call =
        plugin::format("zeMemAllocHost(size = %" PRIu64 "%s)", nbytes, relaxed.describe().c_str());
    ze_.check(ze_.zeMemAllocHost(staging_context(), &desc, nbytes, 0, &host),
              CallKind::host_allocation, "%s", call.c_str());
    plugin::require_memory(host != nullptr, call, "ZE_RESULT_SUCCESS");
    staging_.adopt(
        host, nbytes,
        [this](void* p) { give_back([&] { return ze_.zeMemFree(staging_context(), p); }); },
        call);
    return host;
  }
  void free_host(void* host) override {
    staging_.free(host, [this](void* p) {
      ze_.check(ze_.zeMemFree(staging_context(), p), CallKind::work, "zeMemFree(%p)", p);
    });
  }

 private:
  // The one context (allocate_host refuses with several): Level Zero host
  // allocations are visible to every device of the context.
  ze_context_handle_t staging_context() const { return drivers_.front().context; }

  plugin::StagingTable staging_;
};

struct LevelZeroPlugin {
  static constexpr const char* name = "level_zero";
  static constexpr const char* version = DEVALLOC_LEVEL_ZERO_PLUGIN_VERSION;
  // Free memory as this instance counts it (ZeDevice::memory_info).
  static constexpr bool offers_memory_info = true;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    return plugin::create_over_runtime<LevelZeroInstance>(options, name, "libze_loader.so.1");
  }
};

}  // namespace
}  // namespace devalloc::level_zero

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::level_zero::LevelZeroPlugin)
