// The host plugin as a kit plugin: its instance hands the work to
// HostDevice; the kit's glue checks the arguments and names the call in
// every failure.
#include "host_device.hpp"

#include <devalloc/plugin_kit/plugin_entry.hpp>

#include <cstdint>
#include <memory>
#include <utility>

#ifndef DEVALLOC_HOST_PLUGIN_VERSION
#error "DEVALLOC_HOST_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::host {
namespace {

class HostInstance final : public plugin::Instance {
 public:
  explicit HostInstance(const HostDevice::Settings& device) : device_(device) {}

  uint64_t capability_flags() const override {
    // Device memory is host memory: the host may read straight into it.
    uint64_t flags = DEVALLOC_CAPABILITY_HOST_STAGING | DEVALLOC_CAPABILITY_HOST_ADDRESSABLE;
    if (device_.async()) flags |= DEVALLOC_CAPABILITY_ASYNC_COPY;
    return flags;
  }
  uint64_t max_alignment() const override { return HostDevice::max_alignment; }
  uint64_t natural_alignment() const override { return HostDevice::natural_alignment; }
  uint32_t device_count() const override { return 1; }

  plugin::DeviceDescription describe(uint32_t) override {
    plugin::DeviceDescription d;
    d.name = "host memory";
    d.total_memory_bytes = device_.total_memory();
    d.dlpack_device_type = DEVALLOC_DLPACK_CPU;
    d.dlpack_device_id = 0;
    return d;
  }

  plugin::MemoryInfo memory_info(uint32_t) override {
    return {device_.free_memory(), device_.total_memory()};
  }

  uint64_t allocate(uint32_t, uint64_t nbytes, uint64_t alignment) override {
    return device_.allocate(nbytes, alignment);
  }

  void deallocate(uint32_t, uint64_t address) override { device_.deallocate(address); }

  void copy_during_call(uint32_t, uint64_t dst, const void* src, uint64_t nbytes) override {
    device_.copy_now(dst, src, nbytes);
  }

  void copy_until_released(uint32_t, uint64_t dst, const void* src, uint64_t nbytes,
                           plugin::Release release) override {
    device_.copy_later(dst, src, nbytes, std::move(release));
  }

  void copy_to_host(uint32_t, void* dst, uint64_t src, uint64_t nbytes) override {
    device_.copy_to_host(dst, src, nbytes);
  }

  void synchronize(uint32_t) override { device_.synchronize(); }

  void* allocate_host(uint64_t nbytes) override { return device_.allocate_host(nbytes); }
  void free_host(void* host) override { device_.free_host(host); }

 private:
  HostDevice device_;
};

struct HostPlugin {
  static constexpr const char* name = "host";
  static constexpr const char* version = DEVALLOC_HOST_PLUGIN_VERSION;
  static constexpr bool offers_memory_info = true;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    HostDevice::Settings device;
    device.async = options.take_bool("async", false);
    device.memory_limit = options.take_u64("memory_limit", 0);
    device.pool = options.take_bool("pool", false);
    options.reject_unknown(name, "async, memory_limit, pool");
    return std::make_unique<HostInstance>(device);
  }
};

}  // namespace
}  // namespace devalloc::host

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::host::HostPlugin)
