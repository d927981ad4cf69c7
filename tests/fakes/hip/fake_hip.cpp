// A fake HIP runtime: the part of the HIP API that devalloc's HIP plugin
// uses, built as libamdhip64.so.5 over the fakes' shared machinery
// (tests/fakes/common). It mirrors HIP's documented semantics where they
// differ from CUDA's: the runtime initializes itself on the first call, a
// thread's current device is per thread and starts at 0, a copy from
// pageable host memory is synchronous (done when the call returns, after
// the stream's earlier work) while a copy from hipHostMalloc memory runs
// later on the stream. As on ROCm, a stream callback always gets hipSuccess
// and hipStreamQuery answers hipSuccess or hipErrorNotReady only: the fake
// has no device faults, and a "lost" stream (a query error) exists only
// when a test injects one, standing in for a runtime that reports it.
// Strict where a plugin could be wrong and pass by luck: see README.md.
#include <hip/hip_runtime_api.h>

#include "fake_hip_control.h"

#include <device_heap.hpp>
#include <fake_record.hpp>
#include <work_queue.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
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

struct ihipStream_t {
  ihipStream_t(int d, const PauseSwitch& pause) : device(d), work(pause) {}
  const int device;
  WorkQueue work;
  // ROCm's chain of commands that a synchronize releases (see
  // check_callback_chain): the callbacks queued in all, how many of them a
  // synchronize released (the chain is the difference), and every piece of
  // work queued, to see whether any came while a synchronize waited.
  std::atomic<uint64_t> callbacks{0};
  std::atomic<uint64_t> callbacks_released{0};
  std::atomic<uint64_t> submissions{0};
};

namespace {

using ull = unsigned long long;

#ifdef DEVALLOC_FAKE_HIP_SONAME
// The variant under a newer ROCm's soname says so in its device names.
constexpr const char* kDeviceNameSuffix = " (" DEVALLOC_FAKE_HIP_SONAME ")";
#else
constexpr const char* kDeviceNameSuffix = "";
#endif

struct Device {
  std::string name;
  hipUUID uuid = {};
  std::string pci_bus_id;
};

struct Fake {
  FakeRecord record{"fake libamdhip64", "DEVALLOC_FAKE_HIP_STRICT"};
  DeviceHeap heap{record, "hipFree"};
  PauseSwitch pause;
  std::mutex mutex;
  bool initialized = false;
  hipError_t init_result = hipSuccess;
  // What the environment set (reset() goes back to them) and what a test
  // set since.
  uint64_t env_delay_us = 200;
  uint64_t env_callback_chain_limit = 52000;
  std::atomic<uint64_t> delay_us{200};
  std::atomic<uint64_t> callback_chain_limit{52000};
  std::vector<Device> devices;
  std::set<hipStream_t> streams;
  uint64_t copies_issued = 0;
};

Fake& fake() {
  static Fake* instance = new Fake;
  return *instance;
}

FakeRecord& record() { return fake().record; }

thread_local int current_device = 0;
thread_local bool in_callback = false;

// HIP initializes on its first call; the environment is read then.
hipError_t initialize() {
  Fake& f = fake();
  std::lock_guard lock(f.mutex);
  if (f.initialized) return f.init_result;
  f.initialized = true;
  const char* label = "fake libamdhip64";
  uint64_t count = 0, memory = 0, delay = 0, chain = 0;
  if (!devalloc::fake::read_env_u64(label, "DEVALLOC_FAKE_HIP_DEVICES", 2, &count) ||
      !devalloc::fake::read_env_u64(label, "DEVALLOC_FAKE_HIP_MEMORY_BYTES", uint64_t{1} << 30,
                                    &memory) ||
      !devalloc::fake::read_env_u64(label, "DEVALLOC_FAKE_HIP_DELAY_US", 200, &delay) ||
      !devalloc::fake::read_env_u64(label, "DEVALLOC_FAKE_HIP_CALLBACK_CHAIN_LIMIT", 52000,
                                    &chain) ||
      count > 64) {
    return f.init_result = hipErrorInvalidValue;
  }
  if (count == 0) return f.init_result = hipErrorNoDevice;
  f.env_delay_us = delay;
  f.delay_us = delay;
  f.env_callback_chain_limit = chain;
  f.callback_chain_limit = chain;
  f.heap.reset_devices(count, memory);
  for (uint64_t d = 0; d < count; ++d) {
    Device device;
    device.name = "Fake HIP Device " + std::to_string(d) + kDeviceNameSuffix;
    const unsigned char uuid[16] = {'f', 'a', 'k', 'e', '-', 'h', 'i', 'p',
                                    '-', 'g', 'p', 'u', '-', '0', '0',
                                    static_cast<unsigned char>('0' + d)};
    std::memcpy(device.uuid.bytes, uuid, sizeof uuid);
    char pci[32];
    std::snprintf(pci, sizeof pci, "0000:%02x:00.0", 0x43 + static_cast<unsigned>(d));
    device.pci_bus_id = pci;
    f.devices.push_back(std::move(device));
  }
  return hipSuccess;
}

// Counts the call, then refuses it when it comes from a stream callback,
// was told to fail, or the runtime has no device.
hipError_t enter(const char* name) {
  const auto injected = record().enter(name);
  if (in_callback) {
    record().violation("%s called from a stream callback, which HIP forbids", name);
    return hipErrorNotSupported;
  }
  if (injected) return static_cast<hipError_t>(*injected);
  return initialize();
}

bool valid_device(int device) {
  return device >= 0 && device < static_cast<int>(fake().devices.size());
}

// The stream must be live and its device current: stricter than HIP, which
// uses the stream's device, so that a plugin that forgets its device guard
// is caught.
hipError_t check_stream(const char* name, hipStream_t stream) {
  if (stream == nullptr) {
    record().violation("%s on the null stream, which the fake does not implement", name);
    return hipErrorNotSupported;
  }
  {
    std::lock_guard lock(fake().mutex);
    if (fake().streams.count(stream) == 0) {
      record().violation("%s on an unknown or destroyed stream %p", name,
                         static_cast<void*>(stream));
      return hipErrorInvalidHandle;
    }
  }
  if (stream->device != current_device) {
    record().violation("%s on a stream of device %d while device %d is current", name,
                       stream->device, current_device);
    return hipErrorInvalidDevice;
  }
  return hipSuccess;
}

// ROCm 6.2 to 6.4 crash in hipStreamSynchronize (and in a destroy, which
// synchronizes) once some 53 000 stream callbacks were queued since the
// stream's last completed synchronize: each callback's marker holds the
// command before it, and the synchronize releases the whole chain
// recursively (ROCm/legacy-rocm-build#4751; up to 52 000 worked). The fake
// records a violation instead of crashing; the limit is
// DEVALLOC_FAKE_HIP_CALLBACK_CHAIN_LIMIT or a test's (0: none).
void check_callback_chain(const char* name, hipStream_t stream) {
  const uint64_t limit = fake().callback_chain_limit;
  const uint64_t chained = stream->callbacks - stream->callbacks_released;
  if (limit != 0 && chained > limit) {
    record().violation(
        "%s with %llu stream callbacks queued since the stream's last completed "
        "hipStreamSynchronize, more than %llu: ROCm 6.2-6.4 crash here "
        "(ROCm/legacy-rocm-build#4751)",
        name, static_cast<ull>(chained), static_cast<ull>(limit));
  }
}

struct ErrorText {
  hipError_t result;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {hipSuccess, "hipSuccess", "no error"},
    {hipErrorInvalidValue, "hipErrorInvalidValue", "invalid argument"},
    {hipErrorOutOfMemory, "hipErrorOutOfMemory", "out of memory"},
    {hipErrorNoDevice, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {hipErrorInvalidDevice, "hipErrorInvalidDevice", "invalid device ordinal"},
    {hipErrorInvalidHandle, "hipErrorInvalidHandle", "invalid resource handle"},
    {hipErrorNotReady, "hipErrorNotReady", "device not ready"},
    {hipErrorNotSupported, "hipErrorNotSupported", "operation not supported"},
    {hipErrorUnknown, "hipErrorUnknown", "unknown error"},
};

const ErrorText* find_error(hipError_t result) {
  for (const auto& e : kErrors) {
    if (e.result == result) return &e;
  }
  return nullptr;
}

__attribute__((destructor)) void at_unload() {
  Fake& f = fake();
  record().closing();
  std::vector<hipStream_t> streams;
  {
    std::lock_guard lock(f.mutex);
    streams.assign(f.streams.begin(), f.streams.end());
    f.streams.clear();
  }
  if (!streams.empty()) {
    record().violation("%zu stream(s) never destroyed", streams.size());
    f.pause.set(false);
    for (hipStream_t stream : streams) delete stream;
  }
  for (size_t d = 0; d < f.heap.device_count(); ++d) {
    if (const uint64_t live = f.heap.live(static_cast<int>(d))) {
      record().violation("%llu allocation(s) of device %zu never freed", static_cast<ull>(live),
                         d);
    }
  }
  f.heap.report_unfreed_pins();
  record().strict_verdict();
}

}  // namespace

const char* hipGetErrorName(hipError_t hip_error) {
  const ErrorText* e = find_error(hip_error);
  return e ? e->name : "hipErrorUnknown";
}

const char* hipGetErrorString(hipError_t hip_error) {
  const ErrorText* e = find_error(hip_error);
  return e ? e->text : "unknown error";
}

hipError_t hipGetDeviceCount(int* count) {
  if (count == nullptr) return hipErrorInvalidValue;
  *count = 0;
  if (hipError_t r = enter("hipGetDeviceCount")) return r;
  *count = static_cast<int>(fake().devices.size());
  return hipSuccess;
}

hipError_t hipGetDevice(int* deviceId) {
  if (hipError_t r = enter("hipGetDevice")) return r;
  if (deviceId == nullptr) return hipErrorInvalidValue;
  *deviceId = current_device;
  return hipSuccess;
}

hipError_t hipSetDevice(int deviceId) {
  if (hipError_t r = enter("hipSetDevice")) return r;
  if (!valid_device(deviceId)) return hipErrorInvalidDevice;
  current_device = deviceId;
  return hipSuccess;
}

hipError_t hipDeviceGetName(char* name, int len, hipDevice_t device) {
  if (hipError_t r = enter("hipDeviceGetName")) return r;
  if (!valid_device(device)) return hipErrorInvalidDevice;
  if (name == nullptr || len <= 0) return hipErrorInvalidValue;
  std::snprintf(name, static_cast<size_t>(len), "%s", fake().devices[device].name.c_str());
  return hipSuccess;
}

hipError_t hipDeviceTotalMem(size_t* bytes, hipDevice_t device) {
  if (hipError_t r = enter("hipDeviceTotalMem")) return r;
  if (!valid_device(device)) return hipErrorInvalidDevice;
  if (bytes == nullptr) return hipErrorInvalidValue;
  *bytes = fake().heap.total(device);
  return hipSuccess;
}

hipError_t hipDeviceGetUuid(hipUUID* uuid, hipDevice_t device) {
  if (hipError_t r = enter("hipDeviceGetUuid")) return r;
  if (!valid_device(device)) return hipErrorInvalidDevice;
  if (uuid == nullptr) return hipErrorInvalidValue;
  *uuid = fake().devices[device].uuid;
  return hipSuccess;
}

hipError_t hipDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (hipError_t r = enter("hipDeviceGetPCIBusId")) return r;
  if (!valid_device(device)) return hipErrorInvalidDevice;
  if (pciBusId == nullptr || len < 13) return hipErrorInvalidValue;
  std::snprintf(pciBusId, static_cast<size_t>(len), "%s",
                fake().devices[device].pci_bus_id.c_str());
  return hipSuccess;
}

hipError_t hipMemGetInfo(size_t* free, size_t* total) {
  if (hipError_t r = enter("hipMemGetInfo")) return r;
  if (free == nullptr || total == nullptr) return hipErrorInvalidValue;
  *total = fake().heap.total(current_device);
  *free = *total - fake().heap.used(current_device);
  return hipSuccess;
}

hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags) {
  if (hipError_t r = enter("hipStreamCreateWithFlags")) return r;
  if (stream == nullptr || (flags & ~unsigned{hipStreamNonBlocking}) != 0) {
    return hipErrorInvalidValue;
  }
  auto* created = new ihipStream_t(current_device, fake().pause);
  std::lock_guard lock(fake().mutex);
  fake().streams.insert(created);
  record().created("stream");
  *stream = created;
  return hipSuccess;
}

hipError_t hipStreamDestroy(hipStream_t stream) {
  if (hipError_t r = enter("hipStreamDestroy")) return r;
  {
    std::lock_guard lock(fake().mutex);
    if (fake().streams.erase(stream) == 0) {
      record().violation("hipStreamDestroy(%p): unknown or already destroyed stream",
                         static_cast<void*>(stream));
      return hipErrorInvalidHandle;
    }
  }
  record().gone("stream");
  check_callback_chain("hipStreamDestroy", stream);
  // HIP finishes the stream's work first.
  delete stream;
  return hipSuccess;
}

hipError_t hipStreamSynchronize(hipStream_t stream) {
  const char* name = "hipStreamSynchronize";
  if (hipError_t r = enter(name)) return r;
  if (hipError_t r = check_stream(name, stream)) return r;
  check_callback_chain(name, stream);
  const uint64_t submitted = stream->submissions;
  const uint64_t queued = stream->callbacks;
  stream->work.wait_idle();
  // ROCm cuts the chain only when nothing was queued while it waited.
  if (stream->submissions == submitted) {
    uint64_t released = stream->callbacks_released;
    while (released < queued &&
           !stream->callbacks_released.compare_exchange_weak(released, queued)) {
    }
  }
  return hipSuccess;
}

hipError_t hipStreamQuery(hipStream_t stream) {
  const char* name = "hipStreamQuery";
  if (hipError_t r = enter(name)) return r;
  if (hipError_t r = check_stream(name, stream)) return r;
  return stream->work.busy() ? hipErrorNotReady : hipSuccess;
}

hipError_t hipStreamAddCallback(hipStream_t stream, hipStreamCallback_t callback, void* userData,
                                unsigned int flags) {
  const char* name = "hipStreamAddCallback";
  if (hipError_t r = enter(name)) return r;
  if (hipError_t r = check_stream(name, stream)) return r;
  if (callback == nullptr || flags != 0) return hipErrorInvalidValue;
  ++stream->submissions;
  ++stream->callbacks;
  stream->work.enqueue([stream, callback, userData] {
    in_callback = true;
    callback(stream, hipSuccess, userData);
    in_callback = false;
  });
  return hipSuccess;
}

hipError_t hipMalloc(void** ptr, size_t size) {
  if (hipError_t r = enter("hipMalloc")) return r;
  if (ptr == nullptr) return hipErrorInvalidValue;
  if (size == 0) {
    *ptr = nullptr;
    return hipSuccess;
  }
  if (record().take_null_result("hipMalloc")) {
    *ptr = nullptr;
    return hipSuccess;
  }
  const uint64_t base = fake().heap.allocate(current_device, size);
  if (base == 0) return hipErrorOutOfMemory;
  *ptr = reinterpret_cast<void*>(base);
  return hipSuccess;
}

hipError_t hipFree(void* ptr) {
  if (hipError_t r = enter("hipFree")) return r;
  if (ptr == nullptr) return hipSuccess;
  return fake().heap.free(current_device, reinterpret_cast<uint64_t>(ptr)) ==
                 DeviceHeap::FreeResult::ok
             ? hipSuccess
             : hipErrorInvalidValue;
}

hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, void* src, size_t sizeBytes,
                              hipStream_t stream) {
  const char* name = "hipMemcpyHtoDAsync";
  if (hipError_t r = enter(name)) return r;
  if (hipError_t r = check_stream(name, stream)) return r;
  if (sizeBytes == 0) return hipSuccess;
  if (src == nullptr) return hipErrorInvalidValue;
  Fake& f = fake();
  const auto address = reinterpret_cast<uint64_t>(dst);
  auto target = f.heap.range(name, stream->device, address, sizeBytes);
  if (!target) return hipErrorInvalidValue;
  const uintptr_t pin = f.heap.pin_for_copy(src, sizeBytes);
  uint64_t number = 0;
  {
    std::lock_guard lock(f.mutex);
    number = ++f.copies_issued;
  }
  const uint64_t offset = address - target->base;
  const std::chrono::microseconds delay(f.delay_us.load());
  const SourceSnapshot issued(src, sizeBytes);
  ++stream->submissions;
  const uint64_t ticket = stream->work.enqueue([=] {
    std::this_thread::sleep_for(delay);
    if (!issued.unchanged()) {
      record().violation(
          "source of async copy changed before the copy read it (%s #%llu issued at +%.3f ms, "
          "%zu bytes from %s host memory %p to device %d at 0x%llx)",
          name, static_cast<ull>(number), issued.issued_at_ms(), sizeBytes,
          pin ? "pinned" : "pageable", src, stream->device, static_cast<ull>(address));
    }
    if (!fake().heap.still_live(*target)) {
      record().violation("device memory 0x%llx was freed before the async copy into it ran",
                         static_cast<ull>(address));
    } else {
      std::memcpy(target->bytes.get() + offset, src, sizeBytes);
    }
    fake().heap.unpin(pin);
  });
  // HIP: from pageable memory the copy is synchronous.
  if (pin == 0) stream->work.wait_for(ticket);
  return hipSuccess;
}

hipError_t hipMemcpyDtoHAsync(void* dst, hipDeviceptr_t src, size_t sizeBytes,
                              hipStream_t stream) {
  const char* name = "hipMemcpyDtoHAsync";
  if (hipError_t r = enter(name)) return r;
  if (hipError_t r = check_stream(name, stream)) return r;
  if (sizeBytes == 0) return hipSuccess;
  if (dst == nullptr) return hipErrorInvalidValue;
  Fake& f = fake();
  const auto address = reinterpret_cast<uint64_t>(src);
  auto source = f.heap.range(name, stream->device, address, sizeBytes);
  if (!source) return hipErrorInvalidValue;
  const uintptr_t pin = f.heap.pin_for_copy(dst, sizeBytes);
  const uint64_t offset = address - source->base;
  const std::chrono::microseconds delay(f.delay_us.load());
  ++stream->submissions;
  const uint64_t ticket = stream->work.enqueue([=] {
    std::this_thread::sleep_for(delay);
    if (!fake().heap.still_live(*source)) {
      record().violation("device memory 0x%llx was freed before the async copy from it ran",
                         static_cast<ull>(address));
    } else {
      std::memcpy(dst, source->bytes.get() + offset, sizeBytes);
    }
    fake().heap.unpin(pin);
  });
  if (pin == 0) stream->work.wait_for(ticket);
  return hipSuccess;
}

hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags) {
  if (hipError_t r = enter("hipHostMalloc")) return r;
  (void)flags;
  if (ptr == nullptr || size == 0) return hipErrorInvalidValue;
  if (record().take_null_result("hipHostMalloc")) {
    *ptr = nullptr;
    return hipSuccess;
  }
  void* memory = fake().heap.pin_allocate(size);
  if (memory == nullptr) return hipErrorOutOfMemory;
  *ptr = memory;
  return hipSuccess;
}

hipError_t hipHostFree(void* ptr) {
  if (hipError_t r = enter("hipHostFree")) return r;
  if (ptr == nullptr) return hipSuccess;
  return fake().heap.pin_free("hipHostFree", ptr) ? hipSuccess : hipErrorInvalidValue;
}

// ---------------------------------------------------------------------------
// The test's view: fake_hip_control.h.

int devalloc_fake_hip_violations(char* buf, size_t cap) { return record().violations(buf, cap); }

void devalloc_fake_hip_reset(void) {
  record().reset();
  devalloc_fake_hip_pause(0);
  Fake& f = fake();
  f.delay_us = f.env_delay_us;
  f.callback_chain_limit = f.env_callback_chain_limit;
}

void devalloc_fake_hip_set_delay_us(uint64_t delay_us) { fake().delay_us = delay_us; }

void devalloc_fake_hip_set_callback_chain_limit(uint64_t limit) {
  fake().callback_chain_limit = limit;
}

void devalloc_fake_hip_fail_calls(const char* entry_point, int result, int count) {
  record().fail_calls(entry_point, result, count);
}

void devalloc_fake_hip_fail_calls_after(const char* entry_point, int skip, int result,
                                        int count) {
  record().fail_calls(entry_point, result, count, skip);
}

void devalloc_fake_hip_null_result_next(const char* entry_point) {
  record().null_result_next(entry_point);
}

void devalloc_fake_hip_pause(int paused) {
  Fake& f = fake();
  f.pause.set(paused != 0);
  if (paused) return;
  std::lock_guard lock(f.mutex);
  for (hipStream_t stream : f.streams) stream->work.wake();
}

uint64_t devalloc_fake_hip_calls(const char* entry_point) { return record().calls(entry_point); }

uint64_t devalloc_fake_hip_live_allocations(int device) { return fake().heap.live(device); }

int devalloc_fake_hip_live_objects(char* buf, size_t cap) {
  return record().live_objects(buf, cap);
}

int devalloc_fake_hip_current_device(void) { return current_device; }

int devalloc_fake_hip_read(uint64_t address, void* dst, size_t nbytes) {
  return fake().heap.read(address, dst, nbytes);
}
