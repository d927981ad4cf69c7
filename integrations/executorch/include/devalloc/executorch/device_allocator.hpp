// devalloc as ExecuTorch's device allocator: an
// executorch::runtime::DeviceAllocator whose memory comes from whichever
// devalloc plugin the runtime config maps a device tag to.
//
//   auto runtime = devalloc::Runtime::create(devalloc::read_config("devalloc.toml").value());
//   auto allocator = devalloc::executorch::register_allocator(runtime);  // CUDA -> "cuda:N"
//   if (!allocator.ok()) { /* allocator.status().message() says why */ }
//   // From here ExecuTorch's DeviceMemoryBuffer::create(n, DeviceType::CUDA, 0)
//   // allocates through the plugin that serves the config's "cuda:0".
//
// ExecuTorch device index N of the registered type is the devalloc device
// tag "<tag_name>:N", resolved through the config (with its fallbacks) on
// first use, and again after the runtime's registry dropped a plugin
// instance (DeviceRegistry::drop_plugin, how a faulted device is recovered):
// allocations from then on come from the fresh instance, while memory
// allocated before stays with the instance that allocated it, which copies
// to, copies from and frees it. Host-to-device copies use the "during call" source lifetime:
// ExecuTorch promises nothing about `src` after the call returns. Failures
// come back as ExecuTorch Error codes; devalloc's message is logged with
// ET_LOG(Error, ...).
#pragma once

#include <devalloc/core/runtime.hpp>
#include <devalloc/status.hpp>

#include <executorch/runtime/core/device_allocator.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc::executorch {

namespace et = ::executorch::runtime;
using ::executorch::runtime::etensor::DeviceIndex;
using ::executorch::runtime::etensor::DeviceType;

// The ExecuTorch error code for a devalloc status code.
et::Error to_executorch_error(StatusCode code);

// ExecuTorch's log drops what follows the 255th byte of a message: a
// devalloc message is logged in parts of at most kLogPartBytes, each cut
// before a UTF-8 sequence starts ("... allocate (1/2): ...").
inline constexpr size_t kLogPartBytes = 192;
std::vector<std::string_view> log_parts(std::string_view message);

class DevallocDeviceAllocator final : public et::DeviceAllocator {
 public:
  // Device index N of `type` is the device tag "<tag_name>:N" of runtime.
  DevallocDeviceAllocator(std::shared_ptr<Runtime> runtime, DeviceType type,
                          std::string tag_name);
  // Frees what is still allocated.
  ~DevallocDeviceAllocator() override;
  DevallocDeviceAllocator(const DevallocDeviceAllocator&) = delete;
  DevallocDeviceAllocator& operator=(const DevallocDeviceAllocator&) = delete;

  et::Result<void*> allocate(size_t nbytes, DeviceIndex index,
                             size_t alignment = kDefaultAlignment) override;
  void deallocate(void* ptr, DeviceIndex index) override;
  // src may be reused when this returns ("during call"). Copies of 0 bytes
  // are no-ops that succeed, whatever the pointers (a 0-byte allocation's
  // nullptr included).
  et::Error copy_host_to_device(void* dst, const void* src, size_t nbytes,
                                DeviceIndex index) override;
  et::Error copy_device_to_host(void* dst, const void* src, size_t nbytes,
                                DeviceIndex index) override;
  DeviceType device_type() const override { return type_; }

  // Not (yet) part of ExecuTorch's interface: waits until every copy issued
  // to the device has landed (on the device's current instance, and on any
  // dropped one that still holds memory of this allocator).
  et::Error synchronize(DeviceIndex index);

  // The devalloc device behind an ExecuTorch device index for the next
  // allocation: resolved once, and again after a drop_plugin.
  devalloc::Result<ResolvedDevice> device(DeviceIndex index);
  // "cuda:0"
  std::string tag(DeviceIndex index) const;
  // Allocations made through this allocator and not yet deallocated.
  uint64_t live_allocations() const;

 private:
  struct Allocation {
    DeviceIndex index = 0;
    uint64_t nbytes = 0;
    ResolvedDevice device;  // the instance that allocated it
  };
  struct Resolved {
    uint64_t generation = 0;  // the registry's when it was resolved
    ResolvedDevice device;
  };
  // Logs the failure (naming the call) and returns its ExecuTorch code.
  et::Error fail(const char* call, const Status& status) const;
  // The device of the live allocation of `index` that holds
  // [address, address + nbytes).
  devalloc::Result<ResolvedDevice> check_range(DeviceIndex index, uint64_t address,
                                               uint64_t nbytes, const char* what) const;

  std::shared_ptr<Runtime> runtime_;
  const DeviceType type_;
  const std::string tag_name_;
  mutable std::mutex mutex_;
  std::map<DeviceIndex, Resolved> devices_;
  std::map<uint64_t, Allocation> allocations_;  // by base address
};

// Creates a DevallocDeviceAllocator over runtime and registers it in
// ExecuTorch's DeviceAllocatorRegistry for `type`. The allocator lives until
// the process exits (the registry wants static lifetime). Fails instead of
// aborting, as the registry would, when `type` already has an allocator.
devalloc::Result<DevallocDeviceAllocator*> register_allocator(
    std::shared_ptr<Runtime> runtime, DeviceType type = DeviceType::CUDA,
    std::string tag_name = "cuda");

}  // namespace devalloc::executorch
