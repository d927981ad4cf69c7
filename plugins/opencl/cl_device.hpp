// One OpenCL device as the plugin drives it: its own context and in-order
// command queue, its buffers behind address windows (cl_buffers.hpp), the
// host mappings of those buffers, and the releases of "until released"
// copies, which an event callback of the driver fires as soon as each copy
// is complete, with no call from the host needed.
#pragma once

#include <CL/cl.h>

#include <condition_variable>
#include <cstdint>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/release.hpp>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "cl_buffers.hpp"
#include "cl_runtime.hpp"

namespace devalloc::opencl {

class ClDevice {
 public:
  // The windows take any power of two; the buffers themselves start where
  // the driver puts them (CL_DEVICE_MEM_BASE_ADDR_ALIGN), and kernels see
  // them from offset 0.
  static constexpr uint64_t kNaturalAlignment = 256;
  static constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;

  // Reads the properties, creates the context and the queue. Throws
  // Failure; what was created is released again.
  ClDevice(const Runtime& cl, cl_device_id device, uint32_t index);
  // Waits for every copy and its release, ends the mappings, releases every
  // live buffer, the queue and the context. Never throws.
  ~ClDevice();
  ClDevice(const ClDevice&) = delete;
  ClDevice& operator=(const ClDevice&) = delete;

  const plugin::DeviceDescription& description() const { return description_; }
  // OpenCL 1.2 reports no free memory; never called (the plugin does not
  // offer get_memory_info).
  plugin::MemoryInfo memory_info() const;

  uint64_t allocate(uint64_t nbytes, uint64_t alignment);
  void deallocate(uint64_t address);

  void copy_during_call(uint64_t dst, const void* src, uint64_t nbytes);
  void copy_until_released(uint64_t dst, const void* src, uint64_t nbytes, plugin::Release release);
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes);
  // clFinish, then waits until the callback of every copy issued before has
  // run; reports (once) the copies that failed since the last synchronize.
  void synchronize();
  // The same, reporting nothing: for destroy.
  void quiesce() noexcept;

  // PLUGIN-22: a blocking map of the range (one live buffer), and its unmap.
  void* map(uint64_t address, uint64_t nbytes);
  void unmap(void* host);

  // Host staging memory (PLUGIN-18): a CL_MEM_ALLOC_HOST_PTR buffer of this
  // device's context, mapped once for its whole life.
  struct HostBuffer {
    cl_mem buffer = nullptr;
    void* host = nullptr;
  };
  HostBuffer create_host_buffer(uint64_t nbytes);
  // Unmaps and releases; throws Failure when either fails. *ended says
  // whether the unmap was enqueued: then the buffer is no longer mapped
  // (and released, or given up on), whatever was thrown; else it is still
  // mapped and held, and may be freed again.
  void destroy_host_buffer(const HostBuffer& buffer, bool* ended);
  void give_back_host_buffer(const HostBuffer& buffer) noexcept;

 private:
  struct PendingWrite;
  static void CL_CALLBACK on_write_complete(cl_event event, cl_int status, void* user_data);

  // Ticket of a copy whose callback is owed; bad_alloc leaves nothing.
  uint64_t expect_callback();
  // The callback of ticket came (or never will): wakes synchronize.
  void callback_done(uint64_t ticket, cl_int status, const std::string* what) noexcept;
  // Waits until no ticket up to `last` is owed.
  void wait_for_callbacks(uint64_t last) noexcept;
  // Waits for an enqueued command whose callback could not be set, so that
  // its source is no longer read; clFinish when the wait itself fails.
  void wait_for(cl_event event) noexcept;
  // Enqueues the unmap of host (of buffer) and waits for it; *enqueued
  // (when given) says whether the unmap was enqueued, also when it throws.
  void unmap_and_wait(cl_mem buffer, void* host, const char* what, bool* enqueued = nullptr);
  // Ends the mappings of the buffer at allocation (deallocate, destroy).
  void unmap_all_of(uint64_t allocation);
  void release_objects() noexcept;

  const Runtime& cl_;
  uint32_t index_;
  plugin::DeviceDescription description_;
  uint64_t max_allocation_ = 0;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;

  BufferTable buffers_;

  // Live host mappings: the pointer map_to_host returned (a driver may
  // return one pointer for two maps of one range: each is one entry) ->
  // the buffer and its allocation address.
  struct Mapping {
    cl_mem buffer;
    uint64_t allocation;
  };
  std::mutex mappings_mutex_;
  std::multimap<void*, Mapping> mappings_;

  // Copies whose event callback has not run yet, by ticket; the failures
  // their callbacks reported since the last synchronize.
  std::mutex callbacks_mutex_;
  std::condition_variable callback_came_;
  std::set<uint64_t> owed_;
  uint64_t next_ticket_ = 1;
  uint64_t failures_ = 0;
  std::string first_failure_;
};

}  // namespace devalloc::opencl
