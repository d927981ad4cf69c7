// One CUDA device as the plugin drives it: its primary context and its one
// non-blocking stream, whose host functions complete the kit's release
// queue; the kit's StreamDevice does the rest. The first device's context
// also allocates the pinned host memory handed out for staging.
#pragma once

#include "cuda_driver.hpp"

#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/pinned_staging.hpp>
#include <devalloc/plugin_kit/stream_device.hpp>

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace devalloc::cuda {

// Pops the plugin's context when a ContextScope ends, so that no call
// depends on, or changes, the context the caller had current.
struct PopContext {
  const Driver* driver = nullptr;
  void operator()() const noexcept;
};
using ContextScope = plugin::RuntimeScope<PopContext>;

// The runtime calls of plugin::StreamDevice (stream_device.hpp), and of
// plugin::PinnedStaging for the first device.
class CudaStream final : public plugin::GpuStream {
 public:
  // Reads the properties, retains the primary context and creates the
  // stream. Throws Failure.
  CudaStream(plugin::DeviceDescription& description, const Driver& driver, uint32_t ordinal);
  // Releases the primary context (the stream is destroyed by then).
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  // enter() pushes the primary context; enter(std::nothrow) retries a push
  // that failed (the context is gone only when it keeps failing).
  DEVALLOC_KIT_STREAM_CALLS(ContextScope, Driver)
  // Portable: pinned for every context, not only this device's.
  int allocate_host(uint64_t nbytes, void*& host) const noexcept;
  int free_host(void* host) const noexcept;

 private:
  static void CUDA_CB release_oldest(void* releases);

  const Driver& driver_;
  uint32_t ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
};

using CudaDevice = plugin::StreamDevice<CudaStream>;
using PinnedHostMemory = plugin::PinnedStaging<const CudaStream&>;

// cuInit, then every device the driver reports. A driver without a usable
// GPU (none installed, or all hidden by CUDA_VISIBLE_DEVICES) is a working
// runtime that serves no device: none, rather than a failure, so that a
// config's fallback applies. Throws Failure.
std::vector<std::unique_ptr<CudaDevice>> open_devices(const Driver& driver);

}  // namespace devalloc::cuda
