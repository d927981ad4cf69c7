// One HIP device as the plugin drives it: a guard that makes it the current
// device and then restores the caller's, and its one non-blocking stream,
// whose stream callbacks complete the kit's release queue; the kit's
// StreamDevice does the rest. And the pinned host memory for staging.
#pragma once

#include "hip_runtime.hpp"

#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/pinned_staging.hpp>
#include <devalloc/plugin_kit/stream_device.hpp>

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace devalloc::hip {

// Makes the device the caller had current its current device again when a
// DeviceScope ends, so that no call depends on, or changes, it.
struct RestoreDevice {
  const Runtime* runtime = nullptr;
  int previous = -1;
  void operator()() const noexcept;
};
using DeviceScope = plugin::RuntimeScope<RestoreDevice>;

// The runtime calls of plugin::StreamDevice (stream_device.hpp).
class HipStream final : public plugin::GpuStream {
 public:
  // ROCm 6.2 to 6.4 crash in hipStreamSynchronize once some 53 000 stream
  // callbacks were queued since the stream's last completed synchronize
  // (ROCm/legacy-rocm-build#4751; each callback's marker keeps the command
  // before it, and the chain is released recursively): the plugin waits
  // for its stream before it queues more than this many (docs/plugins/hip.md).
  static constexpr uint64_t kCallbacksPerWait = 4096;

  // Reads the properties and creates the stream. Throws Failure.
  HipStream(plugin::DeviceDescription& description, const Runtime& runtime, int ordinal);

  // enter() makes the device current; enter(std::nothrow) retries a call
  // that failed before the device counts as unreachable.
  DEVALLOC_KIT_STREAM_CALLS(DeviceScope, Runtime)

 private:
  static void release_oldest(hipStream_t stream, hipError_t status, void* releases);

  const Runtime& runtime_;
  int ordinal_;
  hipStream_t stream_ = nullptr;
};

using HipDevice = plugin::StreamDevice<HipStream>;

// Every device the runtime reports; a runtime without devices is
// unavailable, in its own words (hipErrorNoDevice). Throws Failure.
std::vector<std::unique_ptr<HipDevice>> open_devices(const Runtime& runtime);

// The host calls of plugin::PinnedStaging: hipHostMalloc, portable (pinned
// for every device, not only the current one), needs no current device.
class HipHostMemory {
 public:
  explicit HipHostMemory(const Runtime& runtime) : runtime_(runtime) {}

  plugin::NoScope enter() const { return {}; }
  plugin::NoScope enter(std::nothrow_t) const noexcept { return {}; }
  const Runtime& runtime() const { return runtime_; }
  std::string call_text(plugin::RuntimeCall call, const plugin::CallArguments& args) const;
  int allocate_host(uint64_t nbytes, void*& host) const noexcept;
  int free_host(void* host) const noexcept;

 private:
  const Runtime& runtime_;
};

}  // namespace devalloc::hip
