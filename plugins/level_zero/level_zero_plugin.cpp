// The Level Zero plugin: the loader opened at run time, the devices of
// every driver it reports in one context each, and host (staging) memory
// from zeMemAllocHost. The ABI glue is the kit's.
#include "ze_device.hpp"
#include "ze_runtime.hpp"

#include <devalloc/plugin_kit/plugin_entry.hpp>

#include <cinttypes>
#include <memory>
#include <string>
#include <vector>

#ifndef DEVALLOC_LEVEL_ZERO_PLUGIN_VERSION
#error "DEVALLOC_LEVEL_ZERO_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::level_zero {
namespace {

using plugin::Failure;

constexpr devalloc_status kUnavailable = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE;

// One driver's context, created before and destroyed after its devices.
struct Driver {
  ze_driver_handle_t handle = nullptr;
  ze_context_handle_t context = nullptr;
};

class LevelZeroInstance final : public devalloc_instance {
 public:
  explicit LevelZeroInstance(const std::string& library);
  ~LevelZeroInstance() override;

  uint64_t capability_flags() const override {
    uint64_t flags = DEVALLOC_CAPABILITY_ASYNC_COPY;
    if (!drivers_.empty()) flags |= DEVALLOC_CAPABILITY_HOST_STAGING;
    return flags;
  }
  uint64_t max_alignment() const override { return ZeDevice::kMaxAlignment; }
  uint32_t device_count() const override {
    return static_cast<uint32_t>(devices_.size());
  }
  plugin::DeviceDescription describe(uint32_t device) override {
    return devices_[device]->description();
  }
  bool memory_info(uint32_t device, plugin::MemoryInfo& info) override {
    info = devices_[device]->memory_info();
    return true;
  }
  uint64_t allocate(uint32_t device, uint64_t nbytes,
                    uint64_t alignment) override {
    return devices_[device]->allocate(nbytes, alignment);
  }
  void deallocate(uint32_t device, uint64_t address) override {
    devices_[device]->deallocate(address);
  }
  void copy_during_call(uint32_t device, uint64_t dst, const void* src,
                        uint64_t nbytes) override {
    devices_[device]->copy_during_call(dst, src, nbytes);
  }
  void copy_until_released(uint32_t device, uint64_t dst, const void* src,
                           uint64_t nbytes, plugin::Release release) override {
    devices_[device]->copy_until_released(dst, src, nbytes, std::move(release));
  }
  void copy_to_host(uint32_t device, void* dst, uint64_t src,
                    uint64_t nbytes) override {
    devices_[device]->copy_to_host(dst, src, nbytes);
  }
  void synchronize(uint32_t device) override { devices_[device]->synchronize(); }
  void* allocate_host(uint64_t nbytes) override;
  void free_host(void* host) override;

 private:
  void open_drivers();
  void close() noexcept;

  Runtime ze_;
  std::vector<Driver> drivers_;
  std::vector<std::unique_ptr<ZeDevice>> devices_;
  // Host memory of the first driver's context; copies on every device read
  // it, as Level Zero host allocations are visible to all devices of the
  // driver.
  plugin::StagingTable staging_;
};

LevelZeroInstance::LevelZeroInstance(const std::string& library)
    : ze_(library) {
  try {
    open_drivers();
  } catch (...) {
    close();
    throw;
  }
}

LevelZeroInstance::~LevelZeroInstance() { close(); }

void LevelZeroInstance::open_drivers() {
  // Without a driver (none installed, or none that found its hardware),
  // the loader answers ZE_RESULT_ERROR_UNINITIALIZED: the runtime cannot
  // serve, and its own words say why.
  ze_.check(ze_.zeInit(0), kUnavailable, "zeInit(0)");
  uint32_t count = 0;
  ze_.check(ze_.zeDriverGet(&count, nullptr), kUnavailable,
            "zeDriverGet(count)");
  std::vector<ze_driver_handle_t> handles(count);
  ze_.check(ze_.zeDriverGet(&count, handles.data()), kUnavailable,
            "zeDriverGet(%u)", count);
  handles.resize(count);
  for (ze_driver_handle_t handle : handles) {
    uint32_t n = 0;
    ze_.check(ze_.zeDeviceGet(handle, &n, nullptr), kUnavailable,
              "zeDeviceGet(driver %zu, count)", drivers_.size());
    if (n == 0) continue;
    std::vector<ze_device_handle_t> devices(n);
    ze_.check(ze_.zeDeviceGet(handle, &n, devices.data()), kUnavailable,
              "zeDeviceGet(driver %zu)", drivers_.size());
    ze_context_desc_t desc = {};
    desc.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
    Driver driver{handle, nullptr};
    ze_.check(ze_.zeContextCreate(handle, &desc, &driver.context),
              kUnavailable, "zeContextCreate(driver %zu)", drivers_.size());
    drivers_.push_back(driver);
    for (uint32_t i = 0; i < n; ++i) {
      devices_.push_back(std::make_unique<ZeDevice>(
          ze_, driver.context, devices[i],
          static_cast<uint32_t>(devices_.size())));
    }
  }
}

void LevelZeroInstance::close() noexcept {
  // Devices first: they wait for their copies, whose sources may be
  // staging memory freed next.
  devices_.clear();
  if (!drivers_.empty()) {
    const ze_context_handle_t context = drivers_.front().context;
    staging_.for_each([&](void* host, uint64_t) { ze_.zeMemFree(context, host); });
    staging_.clear();
  }
  for (const Driver& driver : drivers_) ze_.zeContextDestroy(driver.context);
  drivers_.clear();
}

void* LevelZeroInstance::allocate_host(uint64_t nbytes) {
  if (drivers_.empty()) {
    throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                  "host memory needs a Level Zero context, and this instance "
                  "has no device"};
  }
  const ze_context_handle_t context = drivers_.front().context;
  ze_host_mem_alloc_desc_t desc = {};
  desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  void* host = nullptr;
  ze_.check(ze_.zeMemAllocHost(context, &desc, nbytes, 0, &host),
            DEVALLOC_STATUS_OUT_OF_HOST_MEMORY,
            "zeMemAllocHost(size = %" PRIu64 ")", nbytes);
  staging_.adopt(host, nbytes, [&](void* p) { ze_.zeMemFree(context, p); });
  return host;
}

void LevelZeroInstance::free_host(void* host) {
  if (drivers_.empty()) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "this instance has no device and allocated no host memory"};
  }
  const ze_context_handle_t context = drivers_.front().context;
  staging_.free(host, [&](void* p) {
    ze_.check(ze_.zeMemFree(context, p), DEVALLOC_STATUS_INVALID_ARGUMENT,
              "zeMemFree(%p)", p);
  });
}

struct LevelZeroPlugin {
  static constexpr const char* name = "level_zero";
  static constexpr const char* version = DEVALLOC_LEVEL_ZERO_PLUGIN_VERSION;

  static std::unique_ptr<devalloc_instance> create(plugin::Options& options) {
    std::string library = "libze_loader.so.1";
    options.take("runtime_library", library);
    options.reject_unknown("level_zero", "runtime_library");
    if (library.empty()) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    "level_zero: option runtime_library is empty"};
    }
    try {
      return std::make_unique<LevelZeroInstance>(library);
    } catch (Failure& failure) {
      // Whatever failed, the runtime could not be set up.
      failure.status = kUnavailable;
      failure.message.insert(0, "level_zero: ");
      throw;
    }
  }
};

}  // namespace
}  // namespace devalloc::level_zero

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::level_zero::LevelZeroPlugin)
