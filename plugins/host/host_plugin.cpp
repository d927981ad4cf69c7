// The host plugin as a kit plugin: its instance hands the work to
// HostDevice; the kit's glue checks the arguments and names the call in
// every failure.
#include "host_device.hpp"
#include "host_variant.hpp"

#include <devalloc/plugin_kit/plugin_entry.hpp>

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#ifndef DEVALLOC_HOST_PLUGIN_VERSION
#error "DEVALLOC_HOST_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::host {
namespace {

class HostInstance final : public plugin::Instance {
 public:
  HostInstance(const HostDevice::Settings& device, const FaultPlan::Settings& faults)
      : faults_(faults), device_(device) {}
  // destroy() lands and releases what host_release_on_sync still holds.
  ~HostInstance() override {
    try {
      land_deferred();
    } catch (...) {
      // Released anyway (Release fires on unwinding); nobody to tell.
    }
  }

  uint64_t capability_flags() const override {
    uint64_t flags = DEVALLOC_CAPABILITY_HOST_STAGING | abi_1_1_capabilities;
    if (device_.async() || releases_on_sync || releases_early) {
      flags |= DEVALLOC_CAPABILITY_ASYNC_COPY;
    }
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
    faults_.before_allocate();
    return device_.allocate(nbytes, alignment);
  }

  void deallocate(uint32_t, uint64_t address) override {
    land_deferred();
    device_.deallocate(address);
  }

  void copy_during_call(uint32_t, uint64_t dst, const void* src, uint64_t nbytes) override {
    if (copy_corrupted(dst, src, nbytes)) return;
    if (breaks_during_call) {
      device_.copy_later(dst, src, nbytes, plugin::Release{}, during_call_read_delay);
    } else {
      device_.copy_now(dst, src, nbytes);
    }
  }

  void copy_until_released(uint32_t, uint64_t dst, const void* src, uint64_t nbytes,
                           plugin::Release release) override {
    try {
      if (copy_corrupted(dst, src, nbytes)) return;
    } catch (...) {
      if (faults_.release_failed_copy_twice()) release.fire_twice_on_purpose();
      throw;
    }
    if (faults_.releases_late()) {
      device_.copy_now(dst, src, nbytes);
      faults_.release_later(std::move(release));
      return;
    }
    if constexpr (releases_on_sync) {
      // The range is checked now (PLUGIN-15); on failure `release` fires as
      // it unwinds (PLUGIN-14), only the copy itself waits for synchronize.
      device_.require_destination(dst, nbytes);
      std::lock_guard lock(deferred_mutex_);
      // Filled once it is in: if making room throws, `release` fires as
      // it unwinds, after the lock (PLUGIN-14).
      deferred_.push_back(Deferred{dst, src, nbytes, plugin::Release()});
      deferred_.back().release = std::move(release);
    } else if constexpr (releases_early) {
      device_.require_destination(dst, nbytes);
      {
        std::lock_guard lock(deferred_mutex_);
        deferred_.push_back(Deferred{dst, src, nbytes, plugin::Release()});
      }
      release.fire();  // the breach: src is read only later, in land_deferred
    } else if constexpr (releases_twice) {
      device_.copy_now(dst, src, nbytes);
      release.fire_twice_on_purpose();
    } else if constexpr (releases_stray) {
      device_.copy_now(dst, src, nbytes);
      release.fire_then_stray_on_purpose();
    } else {
      device_.copy_later(dst, src, nbytes, std::move(release));
    }
  }

  void copy_to_host(uint32_t, void* dst, uint64_t src, uint64_t nbytes) override {
    land_deferred();
    if (faults_.skips_read_back()) return;
    device_.copy_to_host(dst, src, nbytes);
  }

  void synchronize(uint32_t) override {
    land_deferred();
    device_.synchronize();
    faults_.after_synchronize();
  }

  void* allocate_host(uint64_t nbytes) override { return device_.allocate_host(nbytes); }
  void free_host(void* host) override { device_.free_host(host); }

 private:
  // The fault plan's flipped copy: lands at once, first byte inverted.
  bool copy_corrupted(uint64_t dst, const void* src, uint64_t nbytes) {
    if (!faults_.before_copy()) return false;
    const auto* bytes = static_cast<const std::byte*>(src);
    std::vector<std::byte> corrupted(bytes, bytes + nbytes);
    corrupted[0] ^= std::byte{0xff};
    device_.copy_now(dst, corrupted.data(), nbytes);
    return true;
  }

  // host_release_on_sync: copies read their source and release it only
  // here, in issue order; a failed copy still releases (on unwinding).
  // host_early_release: its copies, released already, read their source
  // here.
  void land_deferred() {
    if constexpr (releases_on_sync || releases_early) {
      // Held while landing: a synchronize on another thread that finds the
      // list already taken must still wait until those copies landed.
      std::lock_guard landing(landing_mutex_);
      std::vector<Deferred> pending;
      {
        std::lock_guard lock(deferred_mutex_);
        pending.swap(deferred_);
      }
      for (Deferred& d : pending) {
        device_.copy_now(d.dst, d.src, d.nbytes);
        d.release.fire();
      }
    }
  }

  struct Deferred {
    uint64_t dst;
    const void* src;
    uint64_t nbytes;
    plugin::Release release;
  };

  FaultPlan faults_;
  HostDevice device_;
  std::mutex landing_mutex_;
  std::mutex deferred_mutex_;
  std::vector<Deferred> deferred_;
};

struct HostPlugin {
  static constexpr const char* name = plugin_name;
  static constexpr const char* version = DEVALLOC_HOST_PLUGIN_VERSION;
  static constexpr bool offers_memory_info = true;
  static constexpr size_t api_struct_size = host::api_struct_size;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    HostDevice::Settings device;
    device.async = breaks_during_call || options.take_bool("async", false);
    device.memory_limit = options.take_u64("memory_limit", 0);
    device.pool = options.take_bool("pool", false);
    const auto faults = FaultPlan::take_settings(options);
    options.reject_unknown(plugin_name, accepted_options);
    return std::make_unique<HostInstance>(device, faults);
  }
};

}  // namespace
}  // namespace devalloc::host

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::host::HostPlugin)
