// The host plugin's "vendor side": device memory is aligned host memory, a
// copy is a memcpy, and in async mode copies whose source outlives the call
// run on the kit's completion thread. Fails by throwing plugin::Failure with
// the reason alone (the kit's glue names the call).
#pragma once

#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/completion_thread.hpp>
#include <devalloc/plugin_kit/release.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>

namespace devalloc::host {

class HostDevice {
 public:
  // What alignment 0 means, and the largest alignment honoured.
  static constexpr uint64_t natural_alignment = 256;
  static constexpr uint64_t max_alignment = uint64_t{1} << 20;

  struct Settings {
    // Copies whose source outlives the call run on a completion thread.
    bool async = false;
    // > 0: a device of that many bytes; allocations past it fail with
    // OUT_OF_DEVICE_MEMORY and free_memory() counts down from it. 0: the
    // device is the host's physical RAM.
    uint64_t memory_limit = 0;
    // Freed allocations are kept, touched, for the next allocation of the
    // same size and alignment, instead of going back to the C library.
    bool pool = false;
  };
  explicit HostDevice(const Settings& settings);
  // Lands and releases every queued copy, then frees all memory still live.
  ~HostDevice();
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;

  bool async() const { return queue_ != nullptr; }
  // Physical RAM (what a "device" backed by it could hold at most), or the
  // memory limit.
  uint64_t total_memory() const { return total_memory_; }
  // What the kernel could still hand out without swapping (MemAvailable of
  // /proc/meminfo: free pages plus reclaimable caches), or the part of the
  // memory limit not allocated.
  uint64_t free_memory() const;

  // nbytes > 0; alignment a power of two, natural_alignment to max_alignment.
  uint64_t allocate(uint64_t nbytes, uint64_t alignment);
  void deallocate(uint64_t address);

  // Reads src before returning, ordered after every queued copy.
  void copy_now(uint64_t dst, const void* src, uint64_t nbytes);
  // May read src after returning (async mode); fires release once src has
  // been read, or once the copy failed.
  void copy_later(uint64_t dst, const void* src, uint64_t nbytes, plugin::Release release);
  // Waits for the queued copies issued before it, then reads.
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes);
  // Throws Failure(DEVICE_ERROR) when a queued copy failed since the last
  // call.
  void synchronize();

  void* allocate_host(uint64_t nbytes);
  void free_host(void* host);

 private:
  void perform(uint64_t dst, const void* src, uint64_t nbytes);

  // The memory behind a fresh allocation: from the pool when one of the same
  // size and alignment is there, else from the C library.
  void* obtain(uint64_t nbytes, uint64_t alignment);

  uint64_t total_memory_;
  bool limited_;
  std::mutex allocate_mutex_;  // a limited device checks and records at once
  bool pooling_;
  std::mutex pool_mutex_;
  // Pooled blocks by (size, alignment), and the size and alignment of each
  // live pooled-device allocation, to file it on deallocate.
  std::multimap<std::pair<uint64_t, uint64_t>, void*> pool_;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> shape_of_;
  plugin::AllocationTable allocations_;
  plugin::StagingTable host_buffers_;
  // Shared by copies, exclusive for deallocate: a copy never writes into
  // memory freed under it, whichever thread performs it.
  mutable std::shared_mutex memory_lifetime_;
  std::unique_ptr<plugin::CompletionThread> queue_;
};

}  // namespace devalloc::host
