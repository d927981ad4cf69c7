// The HIP plugin as a kit plugin: its instance holds the runtime, the
// devices and the pinned staging memory (hipHostMalloc).
#include "hip_device.hpp"

#include <devalloc/plugin_kit/device_instance.hpp>
#include <devalloc/plugin_kit/plugin_entry.hpp>

#include <memory>
#include <string>
#include <vector>

#ifndef DEVALLOC_HIP_PLUGIN_VERSION
#error "DEVALLOC_HIP_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::hip {
namespace {

// A base before the devices, so that the runtime is opened before them and
// closed after them, also when a constructor throws.
struct RuntimeHolder {
  explicit RuntimeHolder(const std::vector<std::string>& libraries) : runtime_(libraries) {}
  Runtime runtime_;
};

class HipInstance final : private RuntimeHolder, public plugin::DeviceInstance<HipDevice> {
 public:
  explicit HipInstance(const std::vector<std::string>& libraries)
      : RuntimeHolder(libraries),
        DeviceInstance(open_devices(runtime_)),
        staging_(std::make_unique<plugin::PinnedStaging<HipHostMemory>>(HipHostMemory(runtime_))) {}

  ~HipInstance() override {
    // Staging memory may be the source of copies still in flight.
    quiesce_devices();
    staging_.reset();
    devices_.clear();
  }

  uint64_t capability_flags() const override {
    return DEVALLOC_CAPABILITY_ASYNC_COPY | DEVALLOC_CAPABILITY_HOST_STAGING;
  }

  void* allocate_host(uint64_t nbytes) override { return staging_->allocate(nbytes); }
  void free_host(void* host) override { staging_->free(host); }

 private:
  std::unique_ptr<plugin::PinnedStaging<HipHostMemory>> staging_;
};

struct HipPlugin {
  static constexpr const char* name = "hip";
  static constexpr const char* version = DEVALLOC_HIP_PLUGIN_VERSION;
  static constexpr bool offers_memory_info = true;

  // Newest first: each ROCm major release renames the runtime, and every
  // HIP call this plugin makes kept its binary interface from ROCm 5 to 7
  // (docs/plugins/hip.md, "ROCm releases").
  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    return plugin::create_over_runtime<HipInstance>(
        options, name, {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"});
  }
};

}  // namespace
}  // namespace devalloc::hip

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::hip::HipPlugin)
