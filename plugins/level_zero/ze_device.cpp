#include "ze_device.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <devalloc/plugin_kit/give_back.hpp>
#include <future>
#include <optional>
#include <thread>
#include <utility>

namespace devalloc::level_zero {

namespace {

using plugin::CallKind;
using plugin::Failure;
using plugin::give_back;

constexpr CallKind kWork = CallKind::work;
constexpr devalloc_status kDeviceError = DEVALLOC_STATUS_DEVICE_ERROR;
// After a failed wait the event is polled, first this soon, then twice as
// late each time, up to the longest pause.
constexpr std::chrono::microseconds kFirstPoll{100};
constexpr std::chrono::microseconds kLongestPoll{10000};

// Level Zero's two-call enumeration: the count, then that many structures,
// each with its stype set. query(count, array) is the API call named `call`.
template <class Properties, class Query>
std::vector<Properties> enumerate(const Runtime& ze, ze_structure_type_t stype, const char* call,
                                  uint32_t index, Query&& query) {
  uint32_t count = 0;
  ze.check(query(&count, static_cast<Properties*>(nullptr)), kWork, "%s(device %u, count)", call,
           index);
  std::vector<Properties> all(count);
  for (auto& p : all) {
    p = {};
    p.stype = stype;
  }
  ze.check(query(&count, all.data()), kWork, "%s(device %u)", call, index);
  all.resize(count);
  return all;
}

// A copy-capable queue group, preferring a copy engine that does not
// compute (a dedicated blitter) over the compute group.
uint32_t copy_group(const Runtime& ze, ze_device_handle_t device, uint32_t index) {
  const auto groups = enumerate<ze_command_queue_group_properties_t>(
      ze, ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES,
      "zeDeviceGetCommandQueueGroupProperties", index, [&](uint32_t* n, auto* p) {
        return ze.zeDeviceGetCommandQueueGroupProperties(device, n, p);
      });
  const auto count = static_cast<uint32_t>(groups.size());
  constexpr auto kCopy = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
  constexpr auto kCompute = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE;
  uint32_t chosen = UINT32_MAX;
  for (uint32_t i = 0; i < count; ++i) {
    if ((groups[i].flags & kCopy) == 0) continue;
    if ((groups[i].flags & kCompute) == 0) return i;
    if (chosen == UINT32_MAX) chosen = i;
  }
  if (chosen == UINT32_MAX) {
    throw Failure{kDeviceError, plugin::format("device %u has no queue group that copies "
                                               "(%u groups)",
                                               index, count)};
  }
  return chosen;
}

plugin::DeviceDescription describe(const Runtime& ze, ze_device_handle_t device, uint32_t index,
                                   uint64_t* max_allocation) {
  plugin::DeviceDescription d;
  ze_device_properties_t properties = {};
  properties.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
  ze.check(ze.zeDeviceGetProperties(device, &properties), kWork, "zeDeviceGetProperties(device %u)",
           index);
  *max_allocation = properties.maxMemAllocSize;
  d.name.assign(properties.name, strnlen(properties.name, sizeof properties.name));
  std::memcpy(d.uuid.data(), properties.uuid.id, d.uuid.size());

  const auto memories = enumerate<ze_device_memory_properties_t>(
      ze, ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES, "zeDeviceGetMemoryProperties", index,
      [&](uint32_t* n, auto* p) { return ze.zeDeviceGetMemoryProperties(device, n, p); });
  for (const auto& memory : memories) d.total_memory_bytes += memory.totalSize;

  // ze_pci_ext: a driver without the extension leaves the bus id unknown.
  ze_pci_ext_properties_t pci = {};
  pci.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES;
  const ze_result_t r = ze.zeDevicePciGetPropertiesExt(device, &pci);
  if (r == ZE_RESULT_SUCCESS) {
    d.pci_bus_id = plugin::format("%04x:%02x:%02x.%x", pci.address.domain, pci.address.bus,
                                  pci.address.device, pci.address.function);
  } else if (r != ZE_RESULT_ERROR_UNSUPPORTED_FEATURE) {
    ze.check(r, kWork, "zeDevicePciGetPropertiesExt(device %u)", index);
  }
  d.dlpack_device_type = DEVALLOC_DLPACK_ONEAPI;
  d.dlpack_device_id = static_cast<int32_t>(index);
  return d;
}

}  // namespace

ZeDevice::ZeDevice(const Runtime& ze, ze_context_handle_t context, ze_device_handle_t device,
                   uint32_t index)
    : ze_(ze), context_(context), device_(device), index_(index) {
  try {
    description_ = describe(ze, device, index, &max_allocation_);

    ze_command_queue_desc_t queue = {};
    queue.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
    queue.ordinal = copy_group(ze, device, index);
    queue.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
    queue.priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL;
    ze.check(ze.zeCommandListCreateImmediate(context, device, &queue, &list_), kWork,
             "zeCommandListCreateImmediate(device %u, ordinal %u)", index, queue.ordinal);

    ze_event_pool_desc_t pool = {};
    pool.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
    pool.flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
    pool.count = kEvents;
    ze.check(ze.zeEventPoolCreate(context, &pool, 1, &device_, &pool_), kWork,
             "zeEventPoolCreate(device %u, count %u)", index, kEvents);
    events_.reserve(kEvents);
    free_events_.reserve(kEvents);
    for (uint32_t i = 0; i < kEvents; ++i) {
      ze_event_desc_t event = {};
      event.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
      event.index = i;
      event.signal = ZE_EVENT_SCOPE_FLAG_HOST;
      event.wait = ZE_EVENT_SCOPE_FLAG_HOST;
      ze_event_handle_t handle = nullptr;
      ze.check(ze.zeEventCreate(pool_, &event, &handle), kWork,
               "zeEventCreate(device %u, index %u)", index, i);
      events_.push_back(handle);
      free_events_.push_back(kEvents - 1 - i);
    }
  } catch (...) {
    destroy_objects();
    throw;
  }
}

ZeDevice::~ZeDevice() {
  // Every release fires once its copy is over; then nothing reads the
  // allocations or signals the events any more.
  quiesce();
  allocations_.for_each([this](const plugin::AllocationTable::Allocation& a) {
    give_back([&] { return ze_.zeMemFree(context_, reinterpret_cast<void*>(a.base)); });
  });
  allocations_.clear();
  destroy_objects();
}

void ZeDevice::quiesce() noexcept {
  completions_.wait_for_earlier();
  // A command no event tracks may still be running (a barrier left without
  // its copy): a barrier that signals an event goes after it, and is waited
  // for, before the list is destroyed (destroying a list with unfinished
  // commands is an error, and so is freeing memory they use).
  bool untracked = false;
  {
    std::lock_guard lock(list_mutex_);
    untracked = std::exchange(untracked_, false);
  }
  if (!untracked || list_ == nullptr || lost_) return;
  try {
    drain(take_event());
  } catch (...) {
    // No event left to wait with: nothing more destroy can do.
  }
}

void ZeDevice::destroy_objects() noexcept {
  for (ze_event_handle_t event : events_) give_back([&] { return ze_.zeEventDestroy(event); });
  events_.clear();
  if (pool_ != nullptr) give_back([&] { return ze_.zeEventPoolDestroy(pool_); });
  if (list_ != nullptr) give_back([&] { return ze_.zeCommandListDestroy(list_); });
  pool_ = nullptr;
  list_ = nullptr;
}

plugin::MemoryInfo ZeDevice::memory_info() const {
  // A lost device keeps failing (PLUGIN-17), as CUDA's and HIP's memory
  // queries do: its "free" memory is nothing a host can count on.
  require_alive();
  // Level Zero's core API reports no free memory; what this instance has
  // not allocated is what it can still count on.
  const uint64_t total = description_.total_memory_bytes;
  const uint64_t used = std::min<uint64_t>(used_bytes_, total);
  return plugin::MemoryInfo{total - used, total};
}

void ZeDevice::require_alive() const {
  if (lost_) {
    const char* answered = lost_by_.load();
    throw Failure{kDeviceError,
                  plugin::format("device %u is lost (%s answered ZE_RESULT_ERROR_DEVICE_LOST)",
                                 index_, answered != nullptr ? answered : "a call")};
  }
}

uint64_t ZeDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  require_alive();
  ze_device_mem_alloc_desc_t desc = {};
  desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  RelaxedLimits relaxed(nbytes, max_allocation_);
  desc.pNext = relaxed.chain();
  void* p = nullptr;
  const std::string call =
      plugin::format("zeMemAllocDevice(size = %" PRIu64 ", alignment = %" PRIu64 ", device %u%s)",
                     nbytes, alignment, index_, relaxed.describe().c_str());
  ze_.check(ze_.zeMemAllocDevice(context_, &desc, nbytes, alignment, device_, &p),
            CallKind::device_allocation, "%s", call.c_str());
  plugin::require_memory(p != nullptr, call, "ZE_RESULT_SUCCESS");
  const auto base = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
  // The driver was asked for the alignment and for nbytes only, nothing
  // over: memory not aligned as asked has fewer than nbytes behind its next
  // aligned address, and copies to the buffer's end would land past it.
  if (base % alignment != 0) {
    give_back([&] { return ze_.zeMemFree(context_, p); });
    throw Failure{kDeviceError, plugin::format("%s returned 0x%" PRIx64 ", not aligned to %" PRIu64,
                                               call.c_str(), base, alignment)};
  }
  const uint64_t address = allocations_.adopt(
      base, nbytes, alignment,
      [&](uint64_t) { give_back([&] { return ze_.zeMemFree(context_, p); }); }, call);
  used_bytes_ += nbytes;
  return address;
}

void ZeDevice::deallocate(uint64_t address) {
  uint64_t nbytes = 0;
  allocations_.for_each([&](const plugin::AllocationTable::Allocation& a) {
    if (a.address == address) nbytes = a.nbytes;
  });
  allocations_.free(address, [&](uint64_t base) {
    ze_.check(ze_.zeMemFree(context_, reinterpret_cast<void*>(base)), kWork,
              "zeMemFree(0x%" PRIx64 ")", base);
  });
  used_bytes_ -= nbytes;
}

uint32_t ZeDevice::take_event() {
  std::unique_lock lock(events_mutex_);
  event_freed_.wait(lock,
                    [this] { return !free_events_.empty() || retired_events_ == kEvents; });
  if (free_events_.empty()) {
    throw Failure{kDeviceError, plugin::format("device %u: all %u events of its pool are out of "
                                               "use (their waits or resets failed)",
                                               index_, kEvents)};
  }
  const uint32_t slot = free_events_.back();
  free_events_.pop_back();
  return slot;
}

void ZeDevice::recycle(uint32_t slot) noexcept {
  // Reset before reuse: a signaled event would otherwise report the next
  // copy complete at once, so one that cannot be reset never comes back.
  if (give_back([&] { return ze_.zeEventHostReset(events_[slot]); }) != ZE_RESULT_SUCCESS) {
    retire(slot);
    return;
  }
  {
    std::lock_guard lock(events_mutex_);
    free_events_.push_back(slot);
  }
  event_freed_.notify_one();
}

void ZeDevice::retire(uint32_t) noexcept {
  {
    std::lock_guard lock(events_mutex_);
    ++retired_events_;
  }
  // Waiters learn when the last event went.
  event_freed_.notify_all();
}

ze_result_t ZeDevice::wait_event(uint32_t slot) noexcept {
  ze_result_t r = ze_.zeEventHostSynchronize(events_[slot], UINT64_MAX);
  const char* answered = "zeEventHostSynchronize";
  // A failed wait says nothing about the command: it may still run, read
  // its source and write its destination. So the event is asked again,
  // with growing pauses, until it has signaled or the device is lost; only
  // then may a release fire or a call return. A device that never ends the
  // command and never reports itself lost keeps this waiting: the plugin
  // cannot tell it from a slow one.
  auto pause = kFirstPoll;
  while (r != ZE_RESULT_SUCCESS && r != ZE_RESULT_ERROR_DEVICE_LOST) {
    r = ze_.zeEventQueryStatus(events_[slot]);
    answered = "zeEventQueryStatus";
    if (r == ZE_RESULT_SUCCESS || r == ZE_RESULT_ERROR_DEVICE_LOST) break;
    if (ze_.zeDeviceGetStatus(device_) == ZE_RESULT_ERROR_DEVICE_LOST) {
      r = ZE_RESULT_ERROR_DEVICE_LOST;
      answered = "zeDeviceGetStatus";
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kLongestPoll);
  }
  if (r == ZE_RESULT_ERROR_DEVICE_LOST) mark_lost(answered);
  return r;
}

void ZeDevice::mark_lost(const char* answered) noexcept {
  // The first call to find it lost is the one later failures name.
  const char* none = nullptr;
  lost_by_.compare_exchange_strong(none, answered);
  lost_ = true;
}

ze_result_t ZeDevice::drain(uint32_t slot) noexcept {
  ze_result_t r = ZE_RESULT_SUCCESS;
  {
    std::lock_guard lock(list_mutex_);
    r = ze_.zeCommandListAppendBarrier(list_, events_[slot], 0, nullptr);
  }
  if (r == ZE_RESULT_SUCCESS) {
    r = wait_event(slot);
    // The command is over (done, or gone with its device): nothing signals
    // the event any more.
    recycle(slot);
  } else {
    // Not appended: nothing will signal the event.
    if (r == ZE_RESULT_ERROR_DEVICE_LOST) mark_lost("zeCommandListAppendBarrier");
    recycle(slot);
  }
  return r;
}

uint32_t ZeDevice::append_copy(void* dst, const void* src, uint64_t nbytes, const char* what,
                               bool after_earlier) {
  require_alive();
  const uint32_t slot = take_event();
  append_on(slot, dst, src, nbytes, what, after_earlier);
  return slot;
}

void ZeDevice::append_on(uint32_t slot, void* dst, const void* src, uint64_t nbytes,
                         const char* what, bool after_earlier) {
  ze_result_t r = ZE_RESULT_SUCCESS;
  const char* call = "zeCommandListAppendMemoryCopy";
  {
    std::lock_guard lock(list_mutex_);
    // Commands of one list may overlap unless a barrier orders them.
    if (after_earlier) {
      r = ze_.zeCommandListAppendBarrier(list_, nullptr, 0, nullptr);
      if (r != ZE_RESULT_SUCCESS) call = "zeCommandListAppendBarrier";
    }
    if (r == ZE_RESULT_SUCCESS) {
      r = ze_.zeCommandListAppendMemoryCopy(list_, dst, src, nbytes, events_[slot], 0, nullptr);
      // The barrier stays on the list without the copy.
      if (r != ZE_RESULT_SUCCESS && after_earlier) untracked_ = true;
    }
  }
  if (r == ZE_RESULT_SUCCESS) return;
  recycle(slot);
  if (r == ZE_RESULT_ERROR_DEVICE_LOST) mark_lost(call);
  ze_.check(r, kWork, "%s(%s, %" PRIu64 " bytes, device %u)", call, what, nbytes, index_);
}

void ZeDevice::wait_and_recycle(uint32_t slot, const char* what) {
  const ze_result_t r = wait_event(slot);
  recycle(slot);
  ze_.check(r, kWork, "zeEventHostSynchronize(%s copy, device %u)", what, index_);
}

void ZeDevice::copy_during_call(uint64_t dst, const void* src, uint64_t nbytes) {
  allocations_.require_range(dst, nbytes, "the destination");
  const uint32_t slot =
      append_copy(reinterpret_cast<void*>(dst), src, nbytes, "host to device", false);
  wait_and_recycle(slot, "host to device");
}

void ZeDevice::copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                                   plugin::Release release) {
  allocations_.require_range(dst, nbytes, "the destination");
  require_alive();
  const uint32_t slot = take_event();
  // The job is queued before the copy is appended, so that the release has
  // an owner whatever happens next; it waits to learn whether the append
  // succeeded, and only then for the event.
  std::promise<bool> appended;
  std::shared_future<bool> outcome = appended.get_future().share();
  try {
    completions_.push(
        [this, slot, outcome] {
          if (outcome.get()) wait_and_recycle(slot, "host to device");
        },
        std::move(release));
  } catch (...) {
    recycle(slot);
    throw;
  }
  try {
    append_on(slot, reinterpret_cast<void*>(dst), src, nbytes, "host to device", false);
  } catch (...) {
    appended.set_value(false);
    throw;
  }
  appended.set_value(true);
}

void ZeDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  allocations_.require_range(src, nbytes, "the source");
  // After every copy appended before (PLUGIN-16): a barrier first.
  const uint32_t slot =
      append_copy(dst, reinterpret_cast<const void*>(src), nbytes, "device to host", true);
  wait_and_recycle(slot, "device to host");
}

void ZeDevice::synchronize() {
  // A barrier covers everything appended so far, by any thread (also
  // copies whose calls have not returned yet); then every release owed,
  // also when there was no event left for the barrier.
  ze_result_t drained = ZE_RESULT_SUCCESS;
  std::optional<Failure> no_event;
  if (!lost_) {
    uint32_t slot = 0;
    try {
      slot = take_event();
    } catch (Failure& f) {
      no_event = std::move(f);
    }
    if (!no_event) drained = drain(slot);
  }
  completions_.wait_for_earlier();
  if (no_event) throw *no_event;
  // The barrier or its wait found the device lost: named as such.
  if (drained == ZE_RESULT_ERROR_DEVICE_LOST) {
    ze_.check(drained, kWork, "zeCommandListAppendBarrier + zeEventHostSynchronize(device %u)",
              index_);
  }
  require_alive();
  if (auto failure = completions_.take_error()) {
    throw Failure{kDeviceError, "an earlier copy failed: " + *failure};
  }
  ze_.check(drained, kWork, "zeCommandListAppendBarrier + zeEventHostSynchronize(device %u)",
            index_);
}

}  // namespace devalloc::level_zero
