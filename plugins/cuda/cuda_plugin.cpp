// The CUDA plugin as a kit plugin: its instance holds the driver, the
// devices and the pinned staging memory; the kit's glue checks every
// argument and turns failures into statuses.
#include "cuda_device.hpp"

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

class CudaInstance final : public plugin::Instance {
 public:
  explicit CudaInstance(const std::string& runtime_library)
      : driver_(runtime_library), devices_(open_devices(driver_)) {
    if (!devices_.empty()) pinned_ = std::make_unique<PinnedHostMemory>(driver_, *devices_.front());
  }

  ~CudaInstance() override {
    // Pinned memory may be the source of copies still in flight on any
    // device, so every device is quiet before it is freed.
    for (auto& device : devices_) device->quiesce();
    pinned_.reset();
    devices_.clear();
  }

  uint64_t capability_flags() const override {
    return DEVALLOC_CAPABILITY_ASYNC_COPY | (pinned_ ? DEVALLOC_CAPABILITY_HOST_STAGING : 0);
  }
  uint64_t max_alignment() const override { return CudaDevice::kMaxAlignment; }
  uint64_t natural_alignment() const override { return CudaDevice::kNaturalAlignment; }
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
  Driver driver_;
  std::vector<std::unique_ptr<CudaDevice>> devices_;
  std::unique_ptr<PinnedHostMemory> pinned_;
};

struct CudaPlugin {
  static constexpr const char* name = "cuda";
  static constexpr const char* version = DEVALLOC_CUDA_PLUGIN_VERSION;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    std::string library = "libcuda.so.1";
    options.take("runtime_library", library);
    options.reject_unknown("cuda", "runtime_library");
    if (library.empty()) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "cuda: option runtime_library is empty"};
    }
    try {
      return std::make_unique<CudaInstance>(library);
    } catch (Failure& failure) {
      // Whatever failed, the driver could not be set up.
      failure.status = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE;
      failure.message.insert(0, "cuda: ");
      throw;
    }
  }
};

}  // namespace
}  // namespace devalloc::cuda

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::cuda::CudaPlugin)
