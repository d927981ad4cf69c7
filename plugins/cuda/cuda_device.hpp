// One CUDA device as the plugin drives it: its primary context, its one
// non-blocking stream (whose host functions complete the kit's release
// queue), its live allocations; and the pinned host memory handed out for
// staging.
#pragma once

#include "cuda_driver.hpp"

#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/stream_releases.hpp>

#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace devalloc::cuda {

// Makes a context current on the calling thread for its lifetime and then
// restores what the caller had current, so that no call depends on, or
// changes, the caller's context.
class ContextScope {
 public:
  // Throws Failure (DEVICE_ERROR) when the push fails.
  ContextScope(const Driver& driver, CUcontext context, uint32_t ordinal);
  // For destroy paths: never throws, tries a few times (the context is
  // gone only when it keeps failing); pushed() says whether it worked.
  ContextScope(const Driver& driver, CUcontext context, std::nothrow_t) noexcept;
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

  bool pushed() const { return pushed_; }

 private:
  const Driver& driver_;
  bool pushed_ = false;
};

class CudaDevice final : private plugin::CallbackStream {
 public:
  // What cuMemAlloc guarantees; larger alignments are over-allocated.
  static constexpr uint64_t kNaturalAlignment = 256;
  // A large page; the over-allocation costs alignment - 256 bytes.
  static constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;

  // Reads the properties, retains the primary context and creates the
  // stream. Throws Failure.
  CudaDevice(const Driver& driver, uint32_t ordinal);
  // quiesce(), then frees every live allocation and releases the primary
  // context. Allocates nothing and never throws.
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  uint32_t ordinal() const { return ordinal_; }
  CUcontext context() const { return context_; }
  const plugin::DeviceDescription& description() const { return description_; }
  plugin::MemoryInfo memory_info() const;

  // nbytes > 0; alignment a power of two, at most kMaxAlignment.
  uint64_t allocate(uint64_t nbytes, uint64_t alignment);
  void deallocate(uint64_t address);

  // nbytes > 0 in the three copies. src has been read when this returns.
  void copy_during_call(uint64_t dst, const void* src, uint64_t nbytes);
  // Queues the copy and, behind it, the host function that fires release.
  void copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                           plugin::Release release);
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes);

  // Waits for the stream; every release queued before has fired when it
  // returns or throws (a failed wait is waited out until the stream is idle
  // or its context is lost).
  void synchronize();
  // For destroy: waits for the stream, destroys it whatever happens, fires
  // every release still owed. Never throws; idempotent.
  void quiesce() noexcept;

 private:
  // plugin::CallbackStream over the device's stream; the context is current.
  int enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept override;
  int enqueue_release(plugin::ReleaseQueue& releases) noexcept override;
  int wait() noexcept override;
  State query() noexcept override;
  void destroy() noexcept override;
  static void CUDA_CB release_oldest(void* releases);

  const Driver& driver_;
  uint32_t ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  plugin::DeviceDescription description_;
  plugin::AllocationTable allocations_;
  plugin::StreamReleases releases_{*this};
};

// cuInit, then every device the driver reports. A driver without a usable
// GPU (none installed, or all hidden by CUDA_VISIBLE_DEVICES) is a working
// runtime that serves no device: none, rather than a failure, so that a
// config's fallback applies. Throws Failure.
std::vector<std::unique_ptr<CudaDevice>> open_devices(const Driver& driver);

// Pinned host memory for staging (cuMemHostAlloc, portable to every
// context), allocated with the first device's context current.
class PinnedHostMemory {
 public:
  PinnedHostMemory(const Driver& driver, const CudaDevice& owner)
      : driver_(driver), owner_(owner) {}
  // Frees whatever is still allocated; never throws.
  ~PinnedHostMemory();
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;

  void* allocate(uint64_t nbytes);
  void free(void* host);

 private:
  const Driver& driver_;
  const CudaDevice& owner_;
  plugin::StagingTable buffers_;
};

}  // namespace devalloc::cuda
