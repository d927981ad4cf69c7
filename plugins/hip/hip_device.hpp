// One HIP device as the plugin drives it: a guard that makes it the current
// device and then restores the caller's, its one non-blocking stream (whose
// stream callbacks complete the kit's release queue) and its allocations.
#pragma once

#include "hip_runtime.hpp"

#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/stream_releases.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace devalloc::hip {

// Makes `ordinal` the calling thread's current device and restores the one
// the caller had, so that no call depends on, or changes, it.
class DeviceGuard {
 public:
  // Throws Failure (DEVICE_ERROR) when the device cannot be made current.
  DeviceGuard(const Runtime& runtime, int ordinal);
  // For destroy paths: never throws; active() says whether it worked.
  DeviceGuard(const Runtime& runtime, int ordinal, std::nothrow_t) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  bool active() const { return active_; }

 private:
  const Runtime& runtime_;
  int previous_ = -1;
  bool active_ = false;
};

class HipDevice final : private plugin::CallbackStream {
 public:
  // What hipMalloc guarantees at least; larger alignments are
  // over-allocated, up to a large page.
  static constexpr uint64_t kNaturalAlignment = 256;
  static constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;
  // ROCm 6.2 to 6.4 crash in hipStreamSynchronize once some 53 000 stream
  // callbacks were queued since the stream's last completed synchronize
  // (ROCm/legacy-rocm-build#4751; each callback's marker keeps the command
  // before it, and the chain is released recursively): the plugin waits
  // for its stream before it queues more than this many (docs/plugins/hip.md).
  static constexpr uint64_t kCallbacksPerWait = 4096;

  // Reads the properties and creates the stream. Throws Failure.
  HipDevice(const Runtime& runtime, int ordinal);
  // quiesce(), then frees every live allocation. Never throws.
  ~HipDevice() override;
  HipDevice(const HipDevice&) = delete;
  HipDevice& operator=(const HipDevice&) = delete;

  const plugin::DeviceDescription& description() const { return description_; }
  plugin::MemoryInfo memory_info() const;

  uint64_t allocate(uint64_t nbytes, uint64_t alignment);
  void deallocate(uint64_t address);
  void copy_during_call(uint64_t dst, const void* src, uint64_t nbytes);
  void copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                           plugin::Release release);
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes);
  void synchronize();
  // For destroy: waits, destroys the stream, fires what is still owed.
  void quiesce() noexcept;

 private:
  int enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept override;
  int enqueue_release(plugin::ReleaseQueue& releases) noexcept override;
  int wait() noexcept override;
  State query() noexcept override;
  void destroy() noexcept override;
  static void release_oldest(hipStream_t stream, hipError_t status, void* releases);

  const Runtime& runtime_;
  int ordinal_;
  hipStream_t stream_ = nullptr;
  plugin::DeviceDescription description_;
  plugin::AllocationTable allocations_;
  plugin::StreamReleases releases_{*this, kCallbacksPerWait};
};

// Every device the runtime reports; a runtime without devices is
// unavailable, in its own words (hipErrorNoDevice). Throws Failure.
std::vector<std::unique_ptr<HipDevice>> open_devices(const Runtime& runtime);

}  // namespace devalloc::hip
