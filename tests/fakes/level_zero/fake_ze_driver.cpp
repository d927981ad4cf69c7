// A fake Level Zero driver: the part of the core API that devalloc's Level
// Zero plugin uses, built as a driver library that Debian's real loader
// (libze_loader.so.1) loads through ZE_ENABLE_ALT_DRIVERS. Device memory,
// the record of violations and the late-running command lists are the
// shared fake machinery (tests/fakes/common); this file adds Level Zero's
// surface: drivers, devices, contexts, immediate command lists, event pools
// and events. Wherever a plugin could be wrong and still pass on real
// hardware by luck, the fake is strict and records a violation: README.md
// lists each rule.
//
// DEVALLOC_FAKE_ZE_DRIVER_INDEX (a compile definition, 0 by default) makes
// a second driver of the same source, with devices of its own names,
// UUIDs and PCI addresses, for a loader that loads two drivers.
#include <dlfcn.h>
#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>
#include <link.h>

#include "device_heap.hpp"
#include "fake_record.hpp"
#include "fake_ze_control.h"
#include "work_queue.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

using devalloc::fake::DeviceHeap;
using devalloc::fake::FakeRecord;
using devalloc::fake::PauseSwitch;
using devalloc::fake::SourceSnapshot;
using devalloc::fake::WorkQueue;

// The driver's opaque handles.
struct _ze_driver_handle_t {};
struct _ze_device_handle_t {
  int index = 0;
};
struct _ze_context_handle_t {};
struct _ze_event_pool_handle_t {
  ze_context_handle_t context = nullptr;
  ze_event_pool_flags_t flags = 0;
  uint32_t count = 0;
  uint32_t live_events = 0;
};
struct _ze_event_handle_t {
  ze_event_pool_handle_t pool = nullptr;
  uint32_t index = 0;
  bool signaled = false;
  // Appended commands that will signal it and have not run yet.
  int pending = 0;
  // The command that was to signal it ran on a lost device.
  bool lost = false;
};
struct _ze_command_list_handle_t {
  _ze_command_list_handle_t(int d, ze_context_handle_t c, bool sync,
                            const PauseSwitch& pause)
      : device(d), context(c), synchronous(sync), queue(pause) {}
  const int device;
  const ze_context_handle_t context;
  const bool synchronous;
  // Threads inside an append on this list: more than one is a violation.
  std::atomic<int> users{0};
  // Appended commands that have not finished (counted down before their
  // event signals, so that a user who saw the event sees them done).
  std::atomic<int> unfinished{0};
  WorkQueue queue;
};

namespace {

using ull = unsigned long long;

#ifndef DEVALLOC_FAKE_ZE_DRIVER_INDEX
#define DEVALLOC_FAKE_ZE_DRIVER_INDEX 0
#endif
constexpr int kDriverIndex = DEVALLOC_FAKE_ZE_DRIVER_INDEX;

// Device addresses start here (DeviceHeap's range, bit 47 set).
constexpr uint64_t kDeviceAddresses = uint64_t{1} << 47;

struct Device {
  _ze_device_handle_t handle;
  ze_device_type_t type = ZE_DEVICE_TYPE_GPU;
  std::string name;
  uint8_t uuid[16] = {};
  uint32_t pci_bus = 0;
  bool lost = false;
};

// One device allocation as handed out: zeMemAllocDevice honours any
// power-of-two alignment, the heap aligns to 256, so larger alignments are
// carved out of a larger heap block.
struct Handed {
  int device = 0;
  uint64_t block = 0;  // what the heap returned
};

struct Fake {
  FakeRecord record{"fake Level Zero driver", "DEVALLOC_FAKE_ZE_STRICT"};
  DeviceHeap heap{record, "zeMemFree"};
  PauseSwitch pause;

  std::mutex mutex;
  bool initialized = false;
  std::chrono::microseconds delay{200};
  // ze_device_properties_t.maxMemAllocSize of every device.
  uint64_t max_allocation = 0;
  _ze_driver_handle_t driver;
  std::vector<std::unique_ptr<Device>> devices;
  std::map<uint64_t, Handed> handed;  // by the address handed out
  std::set<ze_context_handle_t> contexts;
  // Each live zeMemAllocHost block, by its address.
  struct HostBlock {
    ze_context_handle_t context = nullptr;
    size_t size = 0;
  };
  std::map<uintptr_t, HostBlock> host_blocks;
  std::set<ze_command_list_handle_t> lists;
  std::set<ze_event_pool_handle_t> pools;
  std::set<ze_event_handle_t> events;
  bool lose_next_copy = false;
  // Destroyed objects stay allocated, and reachable, until exit: late work
  // may still touch them, and their addresses never come back as new
  // handles, so that a stale handle is recognized.
  std::vector<std::shared_ptr<void>> graveyard;

  // Event state; waiters sleep on events_changed.
  std::mutex events_mutex;
  std::condition_variable events_changed;
};

// Never destroyed: list threads and the unload hook use it until the end.
Fake& fake() {
  static Fake* instance = new Fake;
  return *instance;
}

#define violation(...) fake().record.violation(__VA_ARGS__)

// With fake().mutex held.
template <class Handle>
void bury(Handle* object) {
  fake().graveyard.emplace_back(std::shared_ptr<Handle>(object));
}

// Counts the call, then refuses it when a test told it to fail or it
// precedes zeInit.
ze_result_t enter(const char* name, bool needs_init = true) {
  if (auto injected = fake().record.enter(name)) {
    return static_cast<ze_result_t>(*injected);
  }
  if (needs_init) {
    std::lock_guard lock(fake().mutex);
    if (!fake().initialized) return ZE_RESULT_ERROR_UNINITIALIZED;
  }
  return ZE_RESULT_SUCCESS;
}

// The device behind a handle, or nullptr (with a violation) for a handle
// this driver never gave out.
Device* device_of(const char* name, ze_device_handle_t handle) {
  std::lock_guard lock(fake().mutex);
  for (auto& d : fake().devices) {
    if (&d->handle == handle) return d.get();
  }
  violation("%s: device handle %p is not one of this driver's", name,
            static_cast<void*>(handle));
  return nullptr;
}

bool live_context(const char* name, ze_context_handle_t context) {
  std::lock_guard lock(fake().mutex);
  if (fake().contexts.count(context) != 0) return true;
  violation("%s: context %p is unknown or destroyed", name,
            static_cast<void*>(context));
  return false;
}

bool device_lost(int device) {
  std::lock_guard lock(fake().mutex);
  return fake().devices[static_cast<size_t>(device)]->lost;
}

// One end of a copy: device memory (held while the copy is in flight) or
// host memory (a zeMemAllocHost block counted as read, or pageable).
struct Span {
  std::shared_ptr<devalloc::fake::Allocation> device;
  uintptr_t host_block = 0;
  uint64_t offset = 0;
};

bool claim(const char* name, int device, const void* p, size_t n, Span* out) {
  const auto address = reinterpret_cast<uint64_t>(p);
  if (address >= kDeviceAddresses) {
    out->device = fake().heap.range(name, device, address, n);
    out->offset = out->device ? address - out->device->base : 0;
    return out->device != nullptr;
  }
  out->host_block = fake().heap.pin_for_copy(p, n);
  return true;
}

// zeMemAllocHost memory of another copy of this driver loaded in the same
// process (the loader loads one per library that ZE_ENABLE_ALT_DRIVERS
// names): such memory belongs to that driver's contexts. Each copy answers
// through its devalloc_fake_ze_owns_host_memory export; the copies are
// found once, at the first question, when the loader has loaded them all.
bool host_memory_of_another_driver(const void* p) {
  using Owns = int (*)(const void*);
  static const std::vector<Owns> others = [] {
    std::vector<std::string> paths;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          auto* names = static_cast<std::vector<std::string>*>(out);
          if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0')
            names->push_back(info->dlpi_name);
          return 0;
        },
        &paths);
    std::vector<Owns> found;
    for (const std::string& path : paths) {
      // Kept open: a driver stays loaded as long as the loader.
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
      if (handle == nullptr) continue;
      auto owns = reinterpret_cast<Owns>(
          dlsym(handle, "devalloc_fake_ze_owns_host_memory"));
      if (owns != nullptr && owns != &devalloc_fake_ze_owns_host_memory &&
          std::find(found.begin(), found.end(), owns) == found.end()) {
        found.push_back(owns);
      } else {
        dlclose(handle);
      }
    }
    return found;
  }();
  return std::any_of(others.begin(), others.end(),
                     [p](Owns owns) { return owns(p) != 0; });
}

// The specification of zeCommandListAppendMemoryCopy: "the memory was
// allocated ... on the same context" as the command list. zeMemAllocHost
// memory of another context, of this driver or of another one, is a
// violation; pageable memory is allowed.
bool of_the_lists_context(const char* name, ze_command_list_handle_t list,
                          const void* p, const Span& span) {
  if (span.device) return true;
  if (span.host_block != 0) {
    ze_context_handle_t context = nullptr;
    {
      std::lock_guard lock(fake().mutex);
      auto it = fake().host_blocks.find(span.host_block);
      if (it == fake().host_blocks.end()) return true;
      context = it->second.context;
    }
    if (context == list->context) return true;
    violation("%s: host memory %p was allocated (zeMemAllocHost) on context "
              "%p, not on the command list's context %p",
              name, p, static_cast<void*>(context),
              static_cast<void*>(list->context));
    return false;
  }
  if (!host_memory_of_another_driver(p)) return true;
  violation("%s: host memory %p was allocated (zeMemAllocHost) on a context "
            "of another driver, not on the command list's context %p",
            name, p, static_cast<void*>(list->context));
  return false;
}

// ---------------------------------------------------------------------------
// Events.

bool live_event(const char* name, ze_event_handle_t event) {
  std::lock_guard lock(fake().mutex);
  if (fake().events.count(event) != 0) return true;
  violation("%s: event %p is unknown or destroyed", name,
            static_cast<void*>(event));
  return false;
}

// At append: the event will be signaled by the appended command.
bool arm(const char* name, ze_event_handle_t event) {
  if (event == nullptr) return true;
  if (!live_event(name, event)) return false;
  std::lock_guard lock(fake().events_mutex);
  if (event->signaled || event->pending > 0) {
    violation(
        "%s: event %p (index %u) is %s; it must be reset with "
        "zeEventHostReset before it is signaled again",
        name, static_cast<void*>(event), event->index,
        event->signaled ? "still signaled" : "already to be signaled");
  }
  ++event->pending;
  return true;
}

// The end of a command: it no longer counts as unfinished, and its event
// signals (or reports the device lost).
void finish(ze_command_list_handle_t list, ze_event_handle_t event,
            bool lost) {
  --list->unfinished;
  if (event == nullptr) return;
  std::lock_guard lock(fake().events_mutex);
  --event->pending;
  if (lost) {
    event->lost = true;
  } else {
    event->signaled = true;
  }
  fake().events_changed.notify_all();
}

// On a list's worker: waits until every wait event has signaled; false
// when one of them belongs to lost work.
bool wait_events(const std::vector<ze_event_handle_t>& events) {
  std::unique_lock lock(fake().events_mutex);
  for (ze_event_handle_t e : events) {
    fake().events_changed.wait(lock, [e] { return e->signaled || e->lost; });
    if (e->lost) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Command lists.

// Marks a list as used by the calling thread for one append; a second
// thread inside the same list at once is a violation (Level Zero command
// lists are not thread-safe).
class ListUse {
 public:
  ListUse(const char* name, ze_command_list_handle_t list) : list_(list) {
    if (list_->users.fetch_add(1) != 0) {
      violation("%s: command list %p used from two threads at once", name,
                static_cast<void*>(list_));
    }
    // Widens the window in which a second thread would be seen.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  ~ListUse() { list_->users.fetch_sub(1); }
  ListUse(const ListUse&) = delete;
  ListUse& operator=(const ListUse&) = delete;

 private:
  ze_command_list_handle_t list_;
};

bool live_list(const char* name, ze_command_list_handle_t list) {
  std::lock_guard lock(fake().mutex);
  if (fake().lists.count(list) != 0) return true;
  violation("%s: command list %p is unknown or destroyed", name,
            static_cast<void*>(list));
  return false;
}

// Runs op on the list's thread; op ends with finish().
void enqueue(ze_command_list_handle_t list, std::function<void()> op) {
  ++list->unfinished;
  const uint64_t ticket = list->queue.enqueue(std::move(op));
  if (list->synchronous) list->queue.wait_for(ticket);
}

// ---------------------------------------------------------------------------
// API: driver and devices.

// DEVALLOC_FAKE_ZE_DEVICE_TYPES: "gpu", "cpu", "fpga", "mca" or "vpu" per
// device, comma-separated, from device 0 on; devices not named are GPUs.
bool read_device_types(std::vector<ze_device_type_t>* types) {
  const char* text = std::getenv("DEVALLOC_FAKE_ZE_DEVICE_TYPES");
  if (text == nullptr || *text == '\0') return true;
  const std::map<std::string, ze_device_type_t> names = {
      {"gpu", ZE_DEVICE_TYPE_GPU}, {"cpu", ZE_DEVICE_TYPE_CPU},
      {"fpga", ZE_DEVICE_TYPE_FPGA}, {"mca", ZE_DEVICE_TYPE_MCA},
      {"vpu", ZE_DEVICE_TYPE_VPU}};
  const std::string all = text;
  size_t d = 0;
  for (size_t start = 0; start <= all.size(); ++d) {
    const size_t end = std::min(all.find(',', start), all.size());
    const auto it = names.find(all.substr(start, end - start));
    if (it == names.end() || d >= types->size()) {
      std::fprintf(stderr,
                   "fake Level Zero driver: DEVALLOC_FAKE_ZE_DEVICE_TYPES="
                   "\"%s\": expected one of gpu, cpu, fpga, mca, vpu for "
                   "each of at most %zu devices\n",
                   text, types->size());
      return false;
    }
    (*types)[d] = it->second;
    start = end + 1;
  }
  return true;
}

ze_result_t ZE_APICALL fake_zeInit(ze_init_flags_t) {
  if (ze_result_t r = enter("zeInit", false)) return r;
  Fake& f = fake();
  std::lock_guard lock(f.mutex);
  if (f.initialized) return ZE_RESULT_SUCCESS;
  constexpr const char* kLabel = "fake Level Zero driver";
  uint64_t count = 0, memory = 0, delay = 0, max_allocation = 0;
  if (!devalloc::fake::read_env_u64(kLabel, "DEVALLOC_FAKE_ZE_DEVICES", 2,
                                    &count) ||
      !devalloc::fake::read_env_u64(kLabel, "DEVALLOC_FAKE_ZE_MEMORY_BYTES",
                                    uint64_t{1} << 30, &memory) ||
      !devalloc::fake::read_env_u64(kLabel, "DEVALLOC_FAKE_ZE_DELAY_US", 200,
                                    &delay) ||
      // As on Intel GPUs, whose single allocations are limited to a
      // fraction of their memory (often 4 GiB).
      !devalloc::fake::read_env_u64(kLabel, "DEVALLOC_FAKE_ZE_MAX_ALLOC_BYTES",
                                    memory / 4, &max_allocation) ||
      count > 64 || max_allocation == 0) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  std::vector<ze_device_type_t> types(count, ZE_DEVICE_TYPE_GPU);
  if (!read_device_types(&types)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  // As a driver without a device of its kind: it does not initialize, and
  // the loader drops it.
  if (count == 0) return ZE_RESULT_ERROR_UNINITIALIZED;
  f.delay = std::chrono::microseconds(delay);
  f.max_allocation = max_allocation;
  f.heap.reset_devices(count, memory);
  for (uint64_t d = 0; d < count; ++d) {
    auto device = std::make_unique<Device>();
    device->handle.index = static_cast<int>(d);
    device->type = types[d];
    if (kDriverIndex != 0)
      device->name = "Driver " + std::to_string(kDriverIndex) + " ";
    device->name += "Fake Level Zero Device " + std::to_string(d);
    const uint8_t uuid[16] = {0x1e, 0x7e, 0x10, 0x20, 0xde, 0x5a, 0x40, 0x00,
                              0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
                              static_cast<uint8_t>(kDriverIndex),
                              static_cast<uint8_t>(d)};
    std::memcpy(device->uuid, uuid, sizeof uuid);
    device->pci_bus = 0x3a + 0x20 * kDriverIndex + static_cast<uint32_t>(d);
    f.devices.push_back(std::move(device));
  }
  f.initialized = true;
  return ZE_RESULT_SUCCESS;
}
ze_result_t ZE_APICALL fake_zeDriverGet(uint32_t* count,
                                        ze_driver_handle_t* drivers) {
  if (ze_result_t r = enter("zeDriverGet")) return r;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*count == 0 || drivers == nullptr) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  drivers[0] = &fake().driver;
  *count = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDriverGetApiVersion(ze_driver_handle_t,
                                                  ze_api_version_t* version) {
  if (ze_result_t r = enter("zeDriverGetApiVersion")) return r;
  if (version == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *version = ZE_API_VERSION_CURRENT;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDriverGetProperties(
    ze_driver_handle_t, ze_driver_properties_t* properties) {
  if (ze_result_t r = enter("zeDriverGetProperties")) return r;
  if (properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::memset(properties->uuid.id, 0x5a + kDriverIndex,
              sizeof properties->uuid.id);
  properties->driverVersion = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDriverGetExtensionProperties(
    ze_driver_handle_t, uint32_t* count,
    ze_driver_extension_properties_t* extensions) {
  if (ze_result_t r = enter("zeDriverGetExtensionProperties")) return r;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*count == 0 || extensions == nullptr) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  std::snprintf(extensions[0].name, sizeof extensions[0].name, "%s",
                ZE_RELAXED_ALLOCATION_LIMITS_EXP_NAME);
  extensions[0].version = ZE_RELAXED_ALLOCATION_LIMITS_EXP_VERSION_CURRENT;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDeviceGet(ze_driver_handle_t driver,
                                        uint32_t* count,
                                        ze_device_handle_t* devices) {
  if (ze_result_t r = enter("zeDeviceGet")) return r;
  if (driver != &fake().driver) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::lock_guard lock(fake().mutex);
  const auto n = static_cast<uint32_t>(fake().devices.size());
  if (*count == 0 || devices == nullptr) {
    *count = n;
    return ZE_RESULT_SUCCESS;
  }
  *count = std::min(*count, n);
  for (uint32_t i = 0; i < *count; ++i) devices[i] = &fake().devices[i]->handle;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDeviceGetSubDevices(ze_device_handle_t,
                                                  uint32_t* count,
                                                  ze_device_handle_t*) {
  if (ze_result_t r = enter("zeDeviceGetSubDevices")) return r;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *count = 0;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDeviceGetProperties(
    ze_device_handle_t handle, ze_device_properties_t* properties) {
  if (ze_result_t r = enter("zeDeviceGetProperties")) return r;
  Device* d = device_of("zeDeviceGetProperties", handle);
  if (d == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (properties->stype != ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES) {
    violation("zeDeviceGetProperties: stype is %d, not "
              "ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES",
              static_cast<int>(properties->stype));
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  properties->type = d->type;
  properties->vendorId = 0x8086;
  properties->deviceId = 0x0bd5;
  properties->flags = 0;
  properties->maxMemAllocSize = fake().max_allocation;
  std::memcpy(properties->uuid.id, d->uuid, sizeof d->uuid);
  std::snprintf(properties->name, sizeof properties->name, "%s",
                d->name.c_str());
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDeviceGetCommandQueueGroupProperties(
    ze_device_handle_t handle, uint32_t* count,
    ze_command_queue_group_properties_t* groups) {
  if (ze_result_t r = enter("zeDeviceGetCommandQueueGroupProperties"))
    return r;
  if (device_of("zeDeviceGetCommandQueueGroupProperties", handle) == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // Group 0 computes (and copies), group 1 is a copy engine only.
  constexpr uint32_t kGroups = 2;
  if (*count == 0 || groups == nullptr) {
    *count = kGroups;
    return ZE_RESULT_SUCCESS;
  }
  const ze_command_queue_group_property_flags_t flags[kGroups] = {
      ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE |
          ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY,
      ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY};
  *count = std::min(*count, kGroups);
  for (uint32_t i = 0; i < *count; ++i) {
    groups[i].flags = flags[i];
    groups[i].maxMemoryFillPatternSize = 4;
    groups[i].numQueues = 1;
  }
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDeviceGetMemoryProperties(
    ze_device_handle_t handle, uint32_t* count,
    ze_device_memory_properties_t* properties) {
  if (ze_result_t r = enter("zeDeviceGetMemoryProperties")) return r;
  Device* d = device_of("zeDeviceGetMemoryProperties", handle);
  if (d == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*count == 0 || properties == nullptr) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  properties->flags = 0;
  properties->maxClockRate = 1000;
  properties->maxBusWidth = 64;
  properties->totalSize = fake().heap.total(d->handle.index);
  std::snprintf(properties->name, sizeof properties->name, "HBM");
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDeviceGetStatus(ze_device_handle_t handle) {
  if (ze_result_t r = enter("zeDeviceGetStatus")) return r;
  Device* d = device_of("zeDeviceGetStatus", handle);
  if (d == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  return device_lost(d->handle.index) ? ZE_RESULT_ERROR_DEVICE_LOST
                                      : ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeDevicePciGetPropertiesExt(
    ze_device_handle_t handle, ze_pci_ext_properties_t* properties) {
  if (ze_result_t r = enter("zeDevicePciGetPropertiesExt")) return r;
  Device* d = device_of("zeDevicePciGetPropertiesExt", handle);
  if (d == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (properties->stype != ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES) {
    violation("zeDevicePciGetPropertiesExt: stype is %d, not "
              "ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES",
              static_cast<int>(properties->stype));
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  properties->address = {0, d->pci_bus, 0, 0};
  properties->maxSpeed = {4, 16, int64_t{32} << 30};
  return ZE_RESULT_SUCCESS;
}

// ---------------------------------------------------------------------------
// API: contexts and memory.

ze_result_t ZE_APICALL fake_zeContextCreate(ze_driver_handle_t driver,
                                            const ze_context_desc_t* desc,
                                            ze_context_handle_t* context) {
  if (ze_result_t r = enter("zeContextCreate")) return r;
  if (driver != &fake().driver) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || context == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  auto* c = new _ze_context_handle_t;
  std::lock_guard lock(fake().mutex);
  fake().contexts.insert(c);
  fake().record.created("context");
  *context = c;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeContextDestroy(ze_context_handle_t context) {
  if (ze_result_t r = enter("zeContextDestroy")) return r;
  if (!live_context("zeContextDestroy", context))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  Fake& f = fake();
  std::lock_guard lock(f.mutex);
  for (ze_command_list_handle_t list : f.lists) {
    if (list->context == context) {
      violation("zeContextDestroy: command list %p of the context is still "
                "alive",
                static_cast<void*>(list));
    }
  }
  for (ze_event_pool_handle_t pool : f.pools) {
    if (pool->context == context) {
      violation("zeContextDestroy: event pool %p of the context is still "
                "alive",
                static_cast<void*>(pool));
    }
  }
  f.contexts.erase(context);
  fake().record.gone("context");
  bury(context);
  return ZE_RESULT_SUCCESS;
}

// Whether ze_relaxed_allocation_limits_exp_desc_t with the MAX_SIZE flag is
// chained to an allocation descriptor.
bool relaxed_max_size(const void* next) {
  for (auto* d = static_cast<const ze_base_desc_t*>(next); d != nullptr;
       d = static_cast<const ze_base_desc_t*>(d->pNext)) {
    if (d->stype == ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC) {
      const auto* relaxed =
          reinterpret_cast<const ze_relaxed_allocation_limits_exp_desc_t*>(d);
      constexpr auto kMaxSize = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE;
      if ((relaxed->flags & kMaxSize) != 0) return true;
    }
  }
  return false;
}

// The specification's words for zeMemAllocDevice and zeMemAllocHost: size
// "must be less-than ze_device_properties_t.maxMemAllocSize", unless
// relaxed limits are chained; a driver answers
// ZE_RESULT_ERROR_UNSUPPORTED_SIZE.
bool size_allowed(size_t size, const void* next) {
  return size < fake().max_allocation || relaxed_max_size(next);
}

ze_result_t ZE_APICALL fake_zeMemAllocDevice(
    ze_context_handle_t context, const ze_device_mem_alloc_desc_t* desc,
    size_t size, size_t alignment, ze_device_handle_t handle, void** out) {
  if (ze_result_t r = enter("zeMemAllocDevice")) return r;
  if (!live_context("zeMemAllocDevice", context))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  Device* d = device_of("zeMemAllocDevice", handle);
  if (d == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0)
    return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  if (!size_allowed(size, desc->pNext)) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  const int device = d->handle.index;
  if (device_lost(device)) return ZE_RESULT_ERROR_DEVICE_LOST;
  if (fake().record.take_null_result("zeMemAllocDevice")) {
    *out = nullptr;
    return ZE_RESULT_SUCCESS;
  }
  // A driver that ignores the alignment asked: the heap's 256 bytes only.
  if (fake().record.take_ignore_alignment("zeMemAllocDevice")) alignment = 0;
  const uint64_t extra = alignment > 256 ? alignment - 256 : 0;
  if (size > fake().heap.total(device) - fake().heap.used(device))
    return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  const uint64_t block = fake().heap.allocate(device, size + extra);
  if (block == 0) return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  const uint64_t address =
      extra == 0 ? block : (block + alignment - 1) & ~uint64_t{alignment - 1};
  std::lock_guard lock(fake().mutex);
  fake().handed[address] = Handed{device, block};
  *out = reinterpret_cast<void*>(address);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeMemAllocHost(ze_context_handle_t context,
                                           const ze_host_mem_alloc_desc_t* desc,
                                           size_t size, size_t alignment,
                                           void** out) {
  if (ze_result_t r = enter("zeMemAllocHost")) return r;
  if (!live_context("zeMemAllocHost", context))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  // Host blocks are page-aligned.
  if (alignment > 4096 || (alignment & (alignment - 1)) != 0)
    return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  if (!size_allowed(size, desc->pNext)) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (fake().record.take_null_result("zeMemAllocHost")) {
    *out = nullptr;
    return ZE_RESULT_SUCCESS;
  }
  *out = fake().heap.pin_allocate(size);
  if (*out == nullptr) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  std::lock_guard lock(fake().mutex);
  fake().host_blocks[reinterpret_cast<uintptr_t>(*out)] = {context, size};
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeMemFree(ze_context_handle_t context, void* p) {
  if (ze_result_t r = enter("zeMemFree")) return r;
  if (!live_context("zeMemFree", context))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const auto address = reinterpret_cast<uint64_t>(p);
  if (address < kDeviceAddresses) {
    {
      std::lock_guard lock(fake().mutex);
      fake().host_blocks.erase(address);
    }
    return fake().heap.pin_free("zeMemFree", p)
               ? ZE_RESULT_SUCCESS
               : ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  Handed handed{0, address};
  {
    std::lock_guard lock(fake().mutex);
    auto it = fake().handed.find(address);
    if (it != fake().handed.end()) {
      handed = it->second;
      fake().handed.erase(it);
    }
  }
  // An address never handed out (or freed before) reaches the heap as it
  // is, which records the unknown address or the double free.
  return fake().heap.free(handed.device, handed.block) == DeviceHeap::FreeResult::ok
             ? ZE_RESULT_SUCCESS
             : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

// ---------------------------------------------------------------------------
// API: command lists.

ze_result_t ZE_APICALL fake_zeCommandListCreateImmediate(
    ze_context_handle_t context, ze_device_handle_t handle,
    const ze_command_queue_desc_t* desc, ze_command_list_handle_t* out) {
  if (ze_result_t r = enter("zeCommandListCreateImmediate")) return r;
  if (!live_context("zeCommandListCreateImmediate", context))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  Device* d = device_of("zeCommandListCreateImmediate", handle);
  if (d == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->ordinal >= 2) {
    violation("zeCommandListCreateImmediate: queue group ordinal %u; the "
              "device has 2 groups",
              desc->ordinal);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  if (device_lost(d->handle.index)) return ZE_RESULT_ERROR_DEVICE_LOST;
  auto* list = new _ze_command_list_handle_t(
      d->handle.index, context, desc->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS,
      fake().pause);
  std::lock_guard lock(fake().mutex);
  fake().lists.insert(list);
  fake().record.created("command list");
  *out = list;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeCommandListDestroy(
    ze_command_list_handle_t list) {
  if (ze_result_t r = enter("zeCommandListDestroy")) return r;
  if (!live_list("zeCommandListDestroy", list))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (const int unfinished = list->unfinished; unfinished > 0) {
    violation("zeCommandListDestroy: command list %p destroyed while %d "
              "command(s) had not finished",
              static_cast<void*>(list), unfinished);
  }
  {
    std::lock_guard lock(fake().mutex);
    fake().lists.erase(list);
    fake().record.gone("command list");
  }
  // Work still queued runs first: the fake never drops a command.
  list->queue.stop();
  std::lock_guard lock(fake().mutex);
  bury(list);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeCommandListAppendMemoryCopy(
    ze_command_list_handle_t list, void* dst, const void* src, size_t size,
    ze_event_handle_t signal, uint32_t wait_count, ze_event_handle_t* waits) {
  constexpr const char* kName = "zeCommandListAppendMemoryCopy";
  if (ze_result_t r = enter(kName)) return r;
  if (!live_list(kName, list)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ListUse use(kName, list);
  if (dst == nullptr || src == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (wait_count > 0 && waits == nullptr)
    return ZE_RESULT_ERROR_INVALID_SIZE;
  if (device_lost(list->device)) return ZE_RESULT_ERROR_DEVICE_LOST;
  Span to, from;
  if (!claim(kName, list->device, dst, size, &to))
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (!claim(kName, list->device, src, size, &from)) {
    fake().heap.unpin(to.host_block);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  if (!of_the_lists_context(kName, list, dst, to) ||
      !of_the_lists_context(kName, list, src, from)) {
    fake().heap.unpin(to.host_block);
    fake().heap.unpin(from.host_block);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  if (!arm(kName, signal)) {
    fake().heap.unpin(to.host_block);
    fake().heap.unpin(from.host_block);
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  // The source-lifetime check: a host source is hashed now and again when
  // the copy reads it; a difference means the caller changed (or freed and
  // reused) memory that a copy in flight still had to read.
  auto snapshot = from.device ? nullptr
                              : std::make_shared<SourceSnapshot>(src, size);
  std::vector<ze_event_handle_t> wait_list(waits, waits + wait_count);
  const int device = list->device;
  enqueue(list, [=] {
    std::this_thread::sleep_for(fake().delay);
    bool lost = !wait_events(wait_list);
    {
      std::lock_guard lock(fake().mutex);
      Device& d = *fake().devices[static_cast<size_t>(device)];
      if (fake().lose_next_copy) {
        fake().lose_next_copy = false;
        d.lost = true;
      }
      lost = lost || d.lost;
    }
    for (const Span* span : {&to, &from}) {
      if (span->device && !fake().heap.still_live(*span->device)) {
        violation("%s: device memory 0x%llx was freed before the copy that "
                  "uses it ran",
                  kName, static_cast<ull>(span->device->base));
        lost = true;
      }
    }
    if (!lost) {
      if (snapshot && !snapshot->unchanged()) {
        violation(
            "%s: the host source [%p, +%zu) changed between the append (at "
            "%.3f ms) and the copy reading it (at %.3f ms)",
            kName, src, size, snapshot->issued_at_ms(),
            devalloc::fake::milliseconds_since_start());
      }
      const void* read = from.device
                             ? static_cast<const void*>(
                                   from.device->bytes.get() + from.offset)
                             : src;
      void* write = to.device ? static_cast<void*>(to.device->bytes.get() +
                                                   to.offset)
                              : dst;
      std::memmove(write, read, size);
    }
    fake().heap.unpin(to.host_block);
    fake().heap.unpin(from.host_block);
    finish(list, signal, lost);
  });
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeCommandListAppendBarrier(
    ze_command_list_handle_t list, ze_event_handle_t signal,
    uint32_t wait_count, ze_event_handle_t* waits) {
  constexpr const char* kName = "zeCommandListAppendBarrier";
  if (ze_result_t r = enter(kName)) return r;
  if (!live_list(kName, list)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ListUse use(kName, list);
  if (wait_count > 0 && waits == nullptr)
    return ZE_RESULT_ERROR_INVALID_SIZE;
  if (device_lost(list->device)) return ZE_RESULT_ERROR_DEVICE_LOST;
  if (!arm(kName, signal)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  std::vector<ze_event_handle_t> wait_list(waits, waits + wait_count);
  const int device = list->device;
  // The worker runs a list's commands in order, so everything appended
  // before has run when this does.
  enqueue(list, [=] {
    const bool lost = !wait_events(wait_list) || device_lost(device);
    finish(list, signal, lost);
  });
  return ZE_RESULT_SUCCESS;
}

// ---------------------------------------------------------------------------
// API: event pools and events.

ze_result_t ZE_APICALL fake_zeEventPoolCreate(ze_context_handle_t context,
                                              const ze_event_pool_desc_t* desc,
                                              uint32_t, ze_device_handle_t*,
                                              ze_event_pool_handle_t* out) {
  if (ze_result_t r = enter("zeEventPoolCreate")) return r;
  if (!live_context("zeEventPoolCreate", context))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->count == 0) return ZE_RESULT_ERROR_INVALID_SIZE;
  auto* pool = new _ze_event_pool_handle_t;
  pool->context = context;
  pool->flags = desc->flags;
  pool->count = desc->count;
  std::lock_guard lock(fake().mutex);
  fake().pools.insert(pool);
  fake().record.created("event pool");
  *out = pool;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeEventPoolDestroy(ze_event_pool_handle_t pool) {
  if (ze_result_t r = enter("zeEventPoolDestroy")) return r;
  std::lock_guard lock(fake().mutex);
  if (fake().pools.erase(pool) == 0) {
    violation("zeEventPoolDestroy: event pool %p is unknown or destroyed",
              static_cast<void*>(pool));
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  if (pool->live_events > 0) {
    violation("zeEventPoolDestroy: %u event(s) of the pool not destroyed",
              pool->live_events);
  }
  fake().record.gone("event pool");
  bury(pool);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeEventCreate(ze_event_pool_handle_t pool,
                                          const ze_event_desc_t* desc,
                                          ze_event_handle_t* out) {
  if (ze_result_t r = enter("zeEventCreate")) return r;
  if (desc == nullptr || out == nullptr)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::lock_guard lock(fake().mutex);
  if (fake().pools.count(pool) == 0) {
    violation("zeEventCreate: event pool %p is unknown or destroyed",
              static_cast<void*>(pool));
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  if (desc->index >= pool->count) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  for (ze_event_handle_t e : fake().events) {
    if (e->pool == pool && e->index == desc->index) {
      violation("zeEventCreate: index %u of pool %p already has a live event",
                desc->index, static_cast<void*>(pool));
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
  }
  auto* event = new _ze_event_handle_t;
  event->pool = pool;
  event->index = desc->index;
  ++pool->live_events;
  fake().events.insert(event);
  fake().record.created("event");
  *out = event;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeEventDestroy(ze_event_handle_t event) {
  if (ze_result_t r = enter("zeEventDestroy")) return r;
  {
    std::lock_guard lock(fake().events_mutex);
    if (fake().events.count(event) != 0 && event->pending > 0) {
      violation("zeEventDestroy: event %p destroyed while a command will "
                "still signal it",
                static_cast<void*>(event));
    }
  }
  std::lock_guard lock(fake().mutex);
  if (fake().events.erase(event) == 0) {
    violation("zeEventDestroy: event %p is unknown or destroyed",
              static_cast<void*>(event));
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  --event->pool->live_events;
  fake().record.gone("event");
  bury(event);
  return ZE_RESULT_SUCCESS;
}

bool host_visible(const char* name, ze_event_handle_t event) {
  if ((event->pool->flags & ZE_EVENT_POOL_FLAG_HOST_VISIBLE) != 0) return true;
  violation("%s: event %p is from a pool without "
            "ZE_EVENT_POOL_FLAG_HOST_VISIBLE",
            name, static_cast<void*>(event));
  return false;
}

ze_result_t ZE_APICALL fake_zeEventHostSynchronize(ze_event_handle_t event,
                                                   uint64_t timeout_ns) {
  constexpr const char* kName = "zeEventHostSynchronize";
  if (ze_result_t r = enter(kName)) return r;
  if (!live_event(kName, event)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!host_visible(kName, event)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  std::unique_lock lock(fake().events_mutex);
  auto done = [event] { return event->signaled || event->lost; };
  if (timeout_ns == UINT64_MAX) {
    fake().events_changed.wait(lock, done);
  } else if (!fake().events_changed.wait_for(
                 lock, std::chrono::nanoseconds(timeout_ns), done)) {
    return ZE_RESULT_NOT_READY;
  }
  return event->lost ? ZE_RESULT_ERROR_DEVICE_LOST : ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeEventQueryStatus(ze_event_handle_t event) {
  constexpr const char* kName = "zeEventQueryStatus";
  if (ze_result_t r = enter(kName)) return r;
  if (!live_event(kName, event)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!host_visible(kName, event)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  std::lock_guard lock(fake().events_mutex);
  if (event->lost) return ZE_RESULT_ERROR_DEVICE_LOST;
  return event->signaled ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

ze_result_t ZE_APICALL fake_zeEventHostReset(ze_event_handle_t event) {
  constexpr const char* kName = "zeEventHostReset";
  if (ze_result_t r = enter(kName)) return r;
  if (!live_event(kName, event)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  std::lock_guard lock(fake().events_mutex);
  if (event->pending > 0) {
    violation("zeEventHostReset: event %p reset while a command will still "
              "signal it",
              static_cast<void*>(event));
  }
  event->signaled = false;
  event->lost = false;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL fake_zeEventHostSignal(ze_event_handle_t event) {
  if (ze_result_t r = enter("zeEventHostSignal")) return r;
  if (!live_event("zeEventHostSignal", event))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  std::lock_guard lock(fake().events_mutex);
  event->signaled = true;
  fake().events_changed.notify_all();
  return ZE_RESULT_SUCCESS;
}

// At exit or unload: what a correct user would have cleaned up, then the
// strict verdict.
__attribute__((destructor)) void at_unload() {
  Fake& f = fake();
  f.record.closing();
  std::vector<ze_command_list_handle_t> lists;
  {
    std::lock_guard lock(f.mutex);
    lists.assign(f.lists.begin(), f.lists.end());
    f.lists.clear();
    if (!f.contexts.empty())
      violation("%zu context(s) never destroyed", f.contexts.size());
    if (!f.pools.empty())
      violation("%zu event pool(s) never destroyed", f.pools.size());
  }
  if (const uint64_t live = f.heap.live(-1); live > 0)
    violation("%llu device allocation(s) never freed", static_cast<ull>(live));
  f.heap.report_unfreed_pins();
  if (!lists.empty()) {
    violation("%zu command list(s) never destroyed", lists.size());
    f.pause.set(false);
    for (ze_command_list_handle_t list : lists) list->queue.stop();
  }
  f.record.strict_verdict();
}

// The loader asks for every table at zeInit; the major version must match.
ze_result_t check_version(ze_api_version_t version) {
  return ZE_MAJOR_VERSION(version) == ZE_MAJOR_VERSION(ZE_API_VERSION_CURRENT)
             ? ZE_RESULT_SUCCESS
             : ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
}

}  // namespace

// ---------------------------------------------------------------------------
// What the loader looks up in a driver: one function per table. The tables
// the plugin uses are filled; the others are left empty (the loader then
// answers their calls itself), but must exist, or the loader rejects the
// driver.

#define DEVALLOC_FAKE_ZE_TABLE(function, table_type)                        \
  extern "C" ZE_DLLEXPORT ze_result_t ZE_APICALL function(                  \
      ze_api_version_t version, table_type* table) {                        \
    if (table == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;      \
    if (ze_result_t r = check_version(version)) return r;                   \
    fill(table);                                                            \
    return ZE_RESULT_SUCCESS;                                               \
  }

namespace {
void fill(ze_global_dditable_t* t) { t->pfnInit = fake_zeInit; }
void fill(ze_driver_dditable_t* t) {
  t->pfnGet = fake_zeDriverGet;
  t->pfnGetApiVersion = fake_zeDriverGetApiVersion;
  t->pfnGetProperties = fake_zeDriverGetProperties;
  t->pfnGetExtensionProperties = fake_zeDriverGetExtensionProperties;
}
void fill(ze_device_dditable_t* t) {
  t->pfnGet = fake_zeDeviceGet;
  t->pfnGetSubDevices = fake_zeDeviceGetSubDevices;
  t->pfnGetProperties = fake_zeDeviceGetProperties;
  t->pfnGetCommandQueueGroupProperties =
      fake_zeDeviceGetCommandQueueGroupProperties;
  t->pfnGetMemoryProperties = fake_zeDeviceGetMemoryProperties;
  t->pfnGetStatus = fake_zeDeviceGetStatus;
  t->pfnPciGetPropertiesExt = fake_zeDevicePciGetPropertiesExt;
}
void fill(ze_context_dditable_t* t) {
  t->pfnCreate = fake_zeContextCreate;
  t->pfnDestroy = fake_zeContextDestroy;
}
void fill(ze_command_list_dditable_t* t) {
  t->pfnCreateImmediate = fake_zeCommandListCreateImmediate;
  t->pfnDestroy = fake_zeCommandListDestroy;
  t->pfnAppendMemoryCopy = fake_zeCommandListAppendMemoryCopy;
  t->pfnAppendBarrier = fake_zeCommandListAppendBarrier;
}
void fill(ze_event_pool_dditable_t* t) {
  t->pfnCreate = fake_zeEventPoolCreate;
  t->pfnDestroy = fake_zeEventPoolDestroy;
}
void fill(ze_event_dditable_t* t) {
  t->pfnCreate = fake_zeEventCreate;
  t->pfnDestroy = fake_zeEventDestroy;
  t->pfnHostSignal = fake_zeEventHostSignal;
  t->pfnHostSynchronize = fake_zeEventHostSynchronize;
  t->pfnQueryStatus = fake_zeEventQueryStatus;
  t->pfnHostReset = fake_zeEventHostReset;
}
void fill(ze_mem_dditable_t* t) {
  t->pfnAllocDevice = fake_zeMemAllocDevice;
  t->pfnAllocHost = fake_zeMemAllocHost;
  t->pfnFree = fake_zeMemFree;
}
// Tables the fake leaves empty.
template <class Table>
void fill(Table*) {}
}  // namespace

DEVALLOC_FAKE_ZE_TABLE(zeGetGlobalProcAddrTable, ze_global_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetDriverProcAddrTable, ze_driver_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetDeviceProcAddrTable, ze_device_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetContextProcAddrTable, ze_context_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetCommandListProcAddrTable,
                       ze_command_list_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetEventPoolProcAddrTable, ze_event_pool_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetEventProcAddrTable, ze_event_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetMemProcAddrTable, ze_mem_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetCommandQueueProcAddrTable,
                       ze_command_queue_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetDeviceExpProcAddrTable, ze_device_exp_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetEventExpProcAddrTable, ze_event_exp_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetFabricEdgeExpProcAddrTable,
                       ze_fabric_edge_exp_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetFabricVertexExpProcAddrTable,
                       ze_fabric_vertex_exp_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetFenceProcAddrTable, ze_fence_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetImageExpProcAddrTable, ze_image_exp_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetKernelExpProcAddrTable, ze_kernel_exp_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetModuleBuildLogProcAddrTable,
                       ze_module_build_log_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetModuleProcAddrTable, ze_module_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetPhysicalMemProcAddrTable,
                       ze_physical_mem_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
DEVALLOC_FAKE_ZE_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)

// The sysman (zes) and tools (zet) tables: the loader requires them from
// every driver, the plugin uses none, so their layout is never touched.
#define DEVALLOC_FAKE_ZE_EMPTY_TABLE(function)                               \
  extern "C" ZE_DLLEXPORT ze_result_t ZE_APICALL function(                   \
      ze_api_version_t version, void* table) {                               \
    if (table == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;       \
    return check_version(version);                                           \
  }

DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetDeviceProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetDiagnosticsProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetDriverProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetEngineProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetFabricPortProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetFanProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetFirmwareProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetFrequencyProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetLedProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetMemoryProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetPerformanceFactorProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetPowerProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetPsuProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetRasProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetSchedulerProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetStandbyProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zesGetTemperatureProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetCommandListProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetContextProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetDebugProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetDeviceProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetKernelProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetMetricGroupExpProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetMetricGroupProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetMetricProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetMetricQueryPoolProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetMetricQueryProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetMetricStreamerProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetModuleProcAddrTable)
DEVALLOC_FAKE_ZE_EMPTY_TABLE(zetGetTracerExpProcAddrTable)

// ---------------------------------------------------------------------------
// Control functions for tests (fake_ze_control.h).

extern "C" {

int devalloc_fake_ze_violations(char* buf, size_t cap) {
  return fake().record.violations(buf, cap);
}

void devalloc_fake_ze_reset(void) {
  fake().record.reset();
  {
    std::lock_guard lock(fake().mutex);
    fake().lose_next_copy = false;
    for (auto& d : fake().devices) d->lost = false;
  }
  devalloc_fake_ze_pause(0);
}

void devalloc_fake_ze_fail_calls(const char* api, int result, int count) {
  fake().record.fail_calls(api, result, count);
}

void devalloc_fake_ze_fail_calls_after(const char* api, int skip, int result,
                                       int count) {
  fake().record.fail_calls(api, result, count, skip);
}

void devalloc_fake_ze_null_result_next(const char* api) {
  fake().record.null_result_next(api);
}

void devalloc_fake_ze_ignore_alignment_next(const char* api) {
  fake().record.ignore_alignment_next(api);
}

void devalloc_fake_ze_lose_device_on_next_copy(void) {
  std::lock_guard lock(fake().mutex);
  fake().lose_next_copy = true;
}

void devalloc_fake_ze_pause(int paused) {
  fake().pause.set(paused != 0);
  if (paused) return;
  std::lock_guard lock(fake().mutex);
  for (ze_command_list_handle_t list : fake().lists) list->queue.wake();
}

uint64_t devalloc_fake_ze_calls(const char* api) {
  return fake().record.calls(api);
}

uint64_t devalloc_fake_ze_live_allocations(int device) {
  return fake().heap.live(device);
}

int devalloc_fake_ze_live_objects(char* buf, size_t cap) {
  return fake().record.live_objects(buf, cap);
}

int devalloc_fake_ze_read(uint64_t address, void* dst, size_t nbytes) {
  return fake().heap.read(address, dst, nbytes);
}

int devalloc_fake_ze_owns_host_memory(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(fake().mutex);
  auto it = fake().host_blocks.upper_bound(address);
  if (it == fake().host_blocks.begin()) return 0;
  --it;
  return address - it->first < it->second.size ? 1 : 0;
}

}  // extern "C"
