// One Level Zero device as the plugin drives it: its immediate command list
// (on a copy-capable queue group), a pool of events that copies signal and
// that are reset and reused, and a completion thread that waits on the
// events of "until released" copies and then releases their sources, with
// no call from the host needed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/completion_thread.hpp>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/release.hpp>
#include <mutex>
#include <vector>

#include "ze_runtime.hpp"

namespace devalloc::level_zero {

class ZeDevice {
 public:
  // zeMemAllocDevice takes the alignment itself; the largest one asked of
  // it is a large page.
  static constexpr uint64_t kNaturalAlignment = 256;
  static constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;
  // Events in the device's pool: copies in flight at once. A copy waits
  // for a free event when all are in use.
  static constexpr uint32_t kEvents = 64;

  // Reads the properties, creates the command list, the event pool and its
  // events. Throws Failure; what was created is destroyed again.
  ZeDevice(const Runtime& ze, ze_context_handle_t context, ze_device_handle_t device,
           uint32_t index);
  // Waits for every copy and releases it, then frees every live allocation
  // and destroys the events, the pool and the list. Never throws.
  ~ZeDevice();
  ZeDevice(const ZeDevice&) = delete;
  ZeDevice& operator=(const ZeDevice&) = delete;

  const plugin::DeviceDescription& description() const { return description_; }
  // ze_device_properties_t.maxMemAllocSize.
  uint64_t max_allocation() const { return max_allocation_; }
  plugin::MemoryInfo memory_info() const;

  uint64_t allocate(uint64_t nbytes, uint64_t alignment);
  void deallocate(uint64_t address);

  void copy_during_call(uint64_t dst, const void* src, uint64_t nbytes);
  void copy_until_released(uint64_t dst, const void* src, uint64_t nbytes, plugin::Release release);
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes);
  // Waits until every copy issued before has completed and been released;
  // reports (once) a copy that failed since the last synchronize, and a
  // lost device every time.
  void synchronize();
  // Waits until every copy issued before has completed and been released,
  // and every command appended to the list is over, reporting nothing: for
  // destroy.
  void quiesce() noexcept;

 private:
  // Appends a copy that signals a free event of the pool (after a barrier
  // when after_earlier); returns the event's index.
  uint32_t append_copy(void* dst, const void* src, uint64_t nbytes, const char* what,
                       bool after_earlier);
  // Appends the copy signalling event `slot`; on failure recycles the event
  // and throws.
  void append_on(uint32_t slot, void* dst, const void* src, uint64_t nbytes, const char* what,
                 bool after_earlier);
  // Waits for the event on the calling thread, recycles it, and throws
  // when the device was lost.
  void wait_and_recycle(uint32_t slot, const char* what);
  // Returns once the event's command is over: ZE_RESULT_SUCCESS when it
  // signaled, ZE_RESULT_ERROR_DEVICE_LOST when the event or
  // zeDeviceGetStatus reports the device lost (then marked lost). A failed
  // zeEventHostSynchronize is followed by polling (zeEventQueryStatus),
  // never by giving up: the command may still run.
  ze_result_t wait_event(uint32_t slot) noexcept;
  // The device is lost, as the call `answered` said (the first such call
  // is the one that later failures name).
  void mark_lost(const char* answered) noexcept;
  // Appends a barrier that signals event `slot` and waits for it: every
  // command appended before is over. Returns the append's or the wait's
  // result; the event is recycled either way.
  ze_result_t drain(uint32_t slot) noexcept;
  // A free event of the pool; throws Failure once every event is retired.
  uint32_t take_event();
  // Resets the event and returns it to the pool; one that cannot be reset
  // is retired.
  void recycle(uint32_t slot) noexcept;
  // Keeps the event out of the pool for good: it cannot be reset.
  void retire(uint32_t slot) noexcept;
  void require_alive() const;
  void destroy_objects() noexcept;

  const Runtime& ze_;
  ze_context_handle_t context_;
  ze_device_handle_t device_;
  uint32_t index_;
  plugin::DeviceDescription description_;
  uint64_t max_allocation_ = 0;

  // Level Zero command lists are not thread-safe: one append at a time.
  std::mutex list_mutex_;
  ze_command_list_handle_t list_ = nullptr;
  // A command no event tracks is on the list: a barrier appended before a
  // copy whose own append then failed. quiesce() waits for it. Under
  // list_mutex_.
  bool untracked_ = false;

  ze_event_pool_handle_t pool_ = nullptr;
  std::vector<ze_event_handle_t> events_;
  std::mutex events_mutex_;
  std::condition_variable event_freed_;
  std::vector<uint32_t> free_events_;
  // Events taken out of the pool for good (retire()).
  uint32_t retired_events_ = 0;

  std::atomic<bool> lost_{false};
  // The call that first found the device lost (a string literal).
  std::atomic<const char*> lost_by_{nullptr};
  std::atomic<uint64_t> used_bytes_{0};
  plugin::AllocationTable allocations_;
  // Waits on the events of "until released" copies and fires their
  // releases, oldest first.
  plugin::CompletionThread completions_;
};

}  // namespace devalloc::level_zero
