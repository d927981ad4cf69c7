// The CUDA plugin as a kit plugin: its instance holds the driver, the
// devices and the pinned staging memory; the kit's glue checks every
// argument and turns failures into statuses.
#include "cuda_device.hpp"

#include <devalloc/plugin_kit/device_instance.hpp>
#include <devalloc/plugin_kit/plugin_entry.hpp>

#include <memory>
#include <string>
#include <vector>

#ifndef DEVALLOC_CUDA_PLUGIN_VERSION
#error "DEVALLOC_CUDA_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::cuda {
namespace {

using plugin::Failure;

// A base before the devices, so that the driver is opened before them and
// closed after them, also when a constructor throws.
struct DriverHolder {
  explicit DriverHolder(const std::string& library) : driver_(library) {}
  Driver driver_;
};

class CudaInstance final : private DriverHolder, public plugin::DeviceInstance<CudaDevice> {
 public:
  explicit CudaInstance(const std::string& library)
      : DriverHolder(library), DeviceInstance(open_devices(driver_)) {
    if (!devices_.empty()) {
      pinned_ = std::make_unique<PinnedHostMemory>(devices_.front()->stream());
    }
  }

  ~CudaInstance() override {
    quiesce_devices();
    pinned_.reset();
    devices_.clear();
  }

  uint64_t capability_flags() const override {
    return DEVALLOC_CAPABILITY_ASYNC_COPY | (pinned_ ? DEVALLOC_CAPABILITY_HOST_STAGING : 0);
  }

  void* allocate_host(uint64_t nbytes) override {
    if (!pinned_) {
      throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                    "pinned memory needs a CUDA context, and this instance has no CUDA device "
                    "(PLUGIN-18)"};
    }
    return pinned_->allocate(nbytes);
  }
  void free_host(void* host) override {
    if (!pinned_) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    "this instance has no CUDA device and allocated no pinned memory"};
    }
    pinned_->free(host);
  }

 private:
  std::unique_ptr<PinnedHostMemory> pinned_;
};

struct CudaPlugin {
  static constexpr const char* name = "cuda";
  static constexpr const char* version = DEVALLOC_CUDA_PLUGIN_VERSION;
  static constexpr bool offers_memory_info = true;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    return plugin::create_over_runtime<CudaInstance>(options, name, "libcuda.so.1");
  }
};

}  // namespace
}  // namespace devalloc::cuda

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::cuda::CudaPlugin)
