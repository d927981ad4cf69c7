// The HIP plugin as a kit plugin: its instance holds the runtime, the
// devices and the pinned staging memory (hipHostMalloc).
#include "hip_device.hpp"

#include <devalloc/plugin_kit/plugin_entry.hpp>

#include <memory>
#include <string>
#include <vector>

#ifndef DEVALLOC_HIP_PLUGIN_VERSION
#error "DEVALLOC_HIP_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::hip {
namespace {

using plugin::CallKind;
using plugin::Failure;

class HipInstance final : public plugin::Instance {
 public:
  explicit HipInstance(const std::string& runtime_library)
      : runtime_(runtime_library), devices_(open_devices(runtime_)) {}

  ~HipInstance() override {
    // Staging memory may be the source of copies still in flight.
    for (auto& device : devices_) device->quiesce();
    staging_.for_each(
        [this](void* host, uint64_t) { static_cast<void>(runtime_.hipHostFree(host)); });
    staging_.clear();
    devices_.clear();
  }

  uint64_t capability_flags() const override {
    return DEVALLOC_CAPABILITY_ASYNC_COPY | DEVALLOC_CAPABILITY_HOST_STAGING;
  }
  uint64_t max_alignment() const override { return HipDevice::kMaxAlignment; }
  uint64_t natural_alignment() const override { return HipDevice::kNaturalAlignment; }
  uint32_t device_count() const override { return static_cast<uint32_t>(devices_.size()); }

  plugin::DeviceDescription describe(uint32_t device) override {
    return devices_[device]->description();
  }
  bool memory_info(uint32_t device, plugin::MemoryInfo& info) override {
    info = devices_[device]->memory_info();
    return true;
  }
  uint64_t allocate(uint32_t device, uint64_t nbytes, uint64_t alignment) override {
    return devices_[device]->allocate(nbytes, alignment);
  }
  void deallocate(uint32_t device, uint64_t address) override {
    devices_[device]->deallocate(address);
  }
  void copy_during_call(uint32_t device, uint64_t dst, const void* src,
                        uint64_t nbytes) override {
    devices_[device]->copy_during_call(dst, src, nbytes);
  }
  void copy_until_released(uint32_t device, uint64_t dst, const void* src, uint64_t nbytes,
                           plugin::Release release) override {
    devices_[device]->copy_until_released(dst, src, nbytes, std::move(release));
  }
  void copy_to_host(uint32_t device, void* dst, uint64_t src, uint64_t nbytes) override {
    devices_[device]->copy_to_host(dst, src, nbytes);
  }
  void synchronize(uint32_t device) override { devices_[device]->synchronize(); }

  void* allocate_host(uint64_t nbytes) override {
    void* host = nullptr;
    // Portable: pinned for every device, not only the current one.
    runtime_.check(runtime_.hipHostMalloc(&host, nbytes, hipHostMallocPortable),
                   CallKind::host_allocation,
                   "hipHostMalloc(size = %llu, flags = hipHostMallocPortable)",
                   static_cast<unsigned long long>(nbytes));
    staging_.adopt(host, nbytes, [this](void* p) { static_cast<void>(runtime_.hipHostFree(p)); });
    return host;
  }
  void free_host(void* host) override {
    staging_.free(host, [this](void* p) {
      runtime_.check(runtime_.hipHostFree(p), CallKind::work, "hipHostFree(ptr = %p)", p);
    });
  }

 private:
  Runtime runtime_;
  std::vector<std::unique_ptr<HipDevice>> devices_;
  plugin::StagingTable staging_;
};

struct HipPlugin {
  static constexpr const char* name = "hip";
  static constexpr const char* version = DEVALLOC_HIP_PLUGIN_VERSION;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    std::string library = "libamdhip64.so.5";
    options.take("runtime_library", library);
    options.reject_unknown("hip", "runtime_library");
    if (library.empty()) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "hip: option runtime_library is empty"};
    }
    try {
      return std::make_unique<HipInstance>(library);
    } catch (Failure& failure) {
      // Whatever failed, the runtime could not be set up.
      failure.status = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE;
      failure.message.insert(0, "hip: ");
      throw;
    }
  }
};

}  // namespace
}  // namespace devalloc::hip

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::hip::HipPlugin)
