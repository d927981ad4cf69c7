// One CUDA device as the plugin drives it: its primary context, its one
// non-blocking stream, its live allocations and the releases still owed to
// callers of "until released" copies; and the pinned host memory handed out
// for staging.
#pragma once

#include "cuda_driver.hpp"

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace devalloc::cuda {

// Makes a context current on the calling thread for its lifetime and then
// restores what the caller had current, so that no call depends on, or
// changes, the caller's context.
class ContextScope {
 public:
  // Throws Failure (DEVICE_ERROR) when the push fails.
  ContextScope(const Driver& driver, CUcontext context, uint32_t ordinal);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const Driver& driver_;
};

// The on_release owed to the caller of one "until released" copy. It fires
// at most once: on fire(), or when destroyed unfired, so that a release can
// be handed on (moved) but never lost.
class PendingRelease {
 public:
  PendingRelease() = default;
  PendingRelease(devalloc_release_fn on_release, void* user_data)
      : on_release_(on_release), user_data_(user_data) {}
  PendingRelease(PendingRelease&& other) noexcept;
  PendingRelease& operator=(PendingRelease&& other) noexcept;
  ~PendingRelease() { fire(); }

  void fire() noexcept;

 private:
  devalloc_release_fn on_release_ = nullptr;
  void* user_data_ = nullptr;
};

struct DeviceProperties {
  std::string name;
  uint64_t total_memory_bytes = 0;
  std::array<uint8_t, 16> uuid{};
  std::string pci_bus_id;  // "dddd:bb:dd.f"
};

class CudaDevice {
 public:
  // What cuMemAlloc guarantees; larger alignments are over-allocated.
  static constexpr uint64_t kNaturalAlignment = 256;
  // A large page; the over-allocation costs alignment - 256 bytes.
  static constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;

  // Reads the properties, retains the primary context and creates the
  // stream. Throws Failure.
  CudaDevice(const Driver& driver, uint32_t ordinal);
  // drain(), then frees every live allocation, destroys the stream and
  // releases the primary context.
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  uint32_t ordinal() const { return ordinal_; }
  CUcontext context() const { return context_; }
  const DeviceProperties& properties() const { return properties_; }

  // nbytes > 0; alignment a power of two, at most kMaxAlignment.
  uint64_t allocate(uint64_t nbytes, uint64_t alignment);
  void deallocate(uint64_t address);

  // nbytes > 0 in the three copies. src has been read when this returns.
  void copy_during_call(uint64_t dst, const void* src, uint64_t nbytes);
  // Queues the copy; release fires once the copy has read src, or before
  // this throws.
  void copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                           PendingRelease release);
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes);

  // Waits for the stream; every release queued before has fired when it
  // returns or throws.
  void synchronize();
  // synchronize() for destroy: never throws; every queued release fires.
  void drain() noexcept;

 private:
  // The host function queued behind every "until released" copy.
  static void CUDA_CB release_oldest(void* device);

  void check_range(uint64_t address, uint64_t nbytes, const char* role) const;
  // cuStreamSynchronize. Host functions never run once a context has
  // failed, so on failure the releases they owed fire here.
  CUresult wait_for_stream();
  void fire_all_pending();

  const Driver& driver_;
  uint32_t ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  DeviceProperties properties_;

  plugin::AllocationTable allocations_;
  // What cuMemAlloc_v2 returned, by the address handed out, for allocations
  // rounded up to a larger alignment.
  std::mutex bases_mutex_;
  std::map<uint64_t, uint64_t> bases_;

  // Host functions run in stream order and each fires the oldest pending
  // release; submit_mutex_ keeps the queue's order that of the stream.
  // pending_mutex_ is never held across a CUDA call, so that a host
  // function can always take it.
  std::mutex submit_mutex_;
  std::mutex pending_mutex_;
  std::deque<PendingRelease> pending_;
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
  // Frees whatever is still allocated.
  ~PinnedHostMemory();
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;

  void* allocate(uint64_t nbytes);
  void free(void* host);

 private:
  const Driver& driver_;
  const CudaDevice& owner_;
  std::mutex mutex_;
  std::map<void*, uint64_t> live_;
};

}  // namespace devalloc::cuda
