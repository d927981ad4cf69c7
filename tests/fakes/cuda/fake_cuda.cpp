// A fake CUDA driver: the part of the driver API that devalloc's CUDA plugin
// uses, built as libcuda.so.1, over the fakes' shared machinery
// (tests/fakes/common): device memory on the host heap behind addresses the
// host cannot dereference, streams that run their work later on threads of
// their own, the source-lifetime checker. Wherever a plugin could be wrong
// and still pass on real hardware by luck, the fake is strict and records a
// violation instead: README.md lists each rule and where it is stricter
// than the driver.
//
// Variants, from this one source:
//   DEVALLOC_FAKE_CUDA_INIT_RESULT=<CUresult>  cuInit always fails with it.
//   DEVALLOC_FAKE_CUDA_WITHOUT_UUID_V2         no cuDeviceGetUuid_v2, as in
//                                              a driver older than CUDA 11.4.
#include <cuda.h>

#include "fake_cuda_control.h"

#include <device_heap.hpp>
#include <fake_record.hpp>
#include <work_queue.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using devalloc::fake::Allocation;
using devalloc::fake::DeviceHeap;
using devalloc::fake::FakeRecord;
using devalloc::fake::PauseSwitch;
using devalloc::fake::SourceSnapshot;
using devalloc::fake::WorkQueue;

// The driver's opaque handles.
struct CUctx_st {
  explicit CUctx_st(int d) : device(d) {}
  const int device;
  // False once the primary context was released for the last time; the
  // object stays, so that a stale handle is recognized.
  bool alive = true;
  // A device fault poisons the context: every later call in it fails.
  std::atomic<CUresult> sticky{CUDA_SUCCESS};
};

struct CUstream_st {
  CUstream_st(CUctx_st* c, const PauseSwitch& pause) : ctx(c), work(pause) {}
  CUctx_st* const ctx;
  WorkQueue work;
};

namespace {

using ull = unsigned long long;

constexpr int kMaxContextDepth = 64;

struct Device {
  std::string name;
  CUuuid uuid = {};
  std::string pci_bus_id;
  CUctx_st* primary = nullptr;
  int retains = 0;
};

struct Fake {
  FakeRecord record{"fake libcuda", "DEVALLOC_FAKE_CUDA_STRICT"};
  DeviceHeap heap{record, "cuMemFree_v2"};
  PauseSwitch pause;
  // Devices, contexts and the set of streams.
  std::mutex mutex;
  std::atomic<bool> initialized{false};
  std::chrono::microseconds delay{200};
  bool stage_pageable = false;
  std::vector<Device> devices;
  std::vector<std::unique_ptr<CUctx_st>> contexts;
  std::set<CUstream_st*> streams;
  std::atomic<uint64_t> copies_issued{0};
  std::mutex fault_mutex;
  CUresult fault_next_copy = CUDA_SUCCESS;
  // devalloc_fake_cuda_after_next: entry point name and hook.
  std::string hook_entry_point;
  void (*hook)(void) = nullptr;
};

// Never destroyed: stream threads and the unload hook use it until the end.
Fake& fake() {
  static Fake* instance = new Fake;
  return *instance;
}

FakeRecord& record() { return fake().record; }

thread_local CUctx_st* context_stack[kMaxContextDepth];
thread_local int context_depth = 0;
thread_local bool in_host_function = false;

// Counts the call, then refuses it when it comes from a host function, was
// told to fail, or precedes cuInit.
CUresult enter(const char* name, bool needs_init = true) {
  const auto injected = record().enter(name);
  if (in_host_function) {
    record().violation(
        "%s called from a host function; cuLaunchHostFunc forbids CUDA calls there", name);
    return CUDA_ERROR_NOT_PERMITTED;
  }
  if (injected) return static_cast<CUresult>(*injected);
  if (needs_init && !fake().initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

bool valid_device(CUdevice device) {
  return device >= 0 && device < static_cast<int>(fake().devices.size());
}

CUresult current_context(const char* name, CUctx_st** out, bool allow_sticky = false) {
  if (context_depth == 0) {
    record().violation("%s called with no context current", name);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  CUctx_st* ctx = context_stack[context_depth - 1];
  {
    std::lock_guard lock(fake().mutex);
    if (!ctx->alive) {
      record().violation(
          "%s called with a destroyed context current (device %d's primary context, "
          "released)",
          name, ctx->device);
      return CUDA_ERROR_INVALID_CONTEXT;
    }
  }
  if (!allow_sticky) {
    if (const CUresult sticky = ctx->sticky; sticky != CUDA_SUCCESS) return sticky;
  }
  *out = ctx;
  return CUDA_SUCCESS;
}

// The stream must be live and its context current: stricter than the
// driver, which would use the stream's own context, so that a plugin that
// forgets to push the right context is caught.
CUresult stream_context(const char* name, CUstream stream, CUctx_st** out,
                        bool allow_sticky = false) {
  if (stream == nullptr) {
    record().violation("%s on the legacy default stream, which the fake does not implement",
                       name);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  {
    std::lock_guard lock(fake().mutex);
    if (fake().streams.count(stream) == 0) {
      record().violation("%s on an unknown or destroyed stream %p", name,
                         static_cast<void*>(stream));
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx, allow_sticky)) return r;
  if (ctx != stream->ctx) {
    record().violation("%s on a stream of device %d while device %d's context is current", name,
                       stream->ctx->device, ctx->device);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *out = ctx;
  return CUDA_SUCCESS;
}

// True when the next executed copy is to fail; the context keeps the error.
bool take_fault(CUctx_st* ctx) {
  std::lock_guard lock(fake().fault_mutex);
  if (fake().fault_next_copy == CUDA_SUCCESS) return false;
  ctx->sticky = fake().fault_next_copy;
  fake().fault_next_copy = CUDA_SUCCESS;
  return true;
}

// Runs the hook a test set for entry point `name`, once.
void after_success(const char* name) {
  void (*hook)(void) = nullptr;
  {
    std::lock_guard lock(fake().fault_mutex);
    if (fake().hook == nullptr || fake().hook_entry_point != name) return;
    hook = std::exchange(fake().hook, nullptr);
  }
  hook();
}

void stop(CUstream_st* stream) {
  stream->work.stop();
  delete stream;
}

void wake_all_streams() {
  std::lock_guard lock(fake().mutex);
  for (CUstream_st* stream : fake().streams) stream->work.wake();
}

struct ErrorText {
  CUresult result;
  const char* name;
  const char* text;
};

// What the driver says about the errors the fake returns or is told to.
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* find_error(CUresult result) {
  for (const auto& e : kErrors) {
    if (e.result == result) return &e;
  }
  return nullptr;
}

// At exit or unload: what a correct user would have cleaned up, then the
// strict verdict.
__attribute__((destructor)) void at_unload() {
  Fake& f = fake();
  record().closing();
  std::vector<CUstream_st*> streams;
  {
    std::lock_guard lock(f.mutex);
    streams.assign(f.streams.begin(), f.streams.end());
    f.streams.clear();
    for (size_t d = 0; d < f.devices.size(); ++d) {
      if (f.devices[d].retains > 0) {
        record().violation(
            "device %zu's primary context is still retained %d time(s) at exit (%llu bytes of "
            "device memory in use)",
            d, f.devices[d].retains, static_cast<ull>(f.heap.used(static_cast<int>(d))));
      }
    }
  }
  f.heap.report_unfreed_pins();
  if (!streams.empty()) {
    record().violation("%zu stream(s) never destroyed", streams.size());
    f.pause.set(false);
    for (CUstream_st* stream : streams) stop(stream);
  }
  record().strict_verdict();
}

}  // namespace

// ---------------------------------------------------------------------------
// Driver API. The versioned names are the symbols; cuda.h declares them.

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  if (CUresult r = enter("cuGetErrorName", false)) return r;
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *pStr = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  if (CUresult r = enter("cuGetErrorString", false)) return r;
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *pStr = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  if (CUresult r = enter("cuInit", false)) return r;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
#ifdef DEVALLOC_FAKE_CUDA_INIT_RESULT
  return DEVALLOC_FAKE_CUDA_INIT_RESULT;
#endif
  Fake& f = fake();
  std::lock_guard lock(f.mutex);
  if (f.initialized) return CUDA_SUCCESS;
  const char* label = "fake libcuda";
  uint64_t count = 0, memory = 0, delay = 0;
  if (!devalloc::fake::read_env_u64(label, "DEVALLOC_FAKE_CUDA_DEVICES", 2, &count) ||
      !devalloc::fake::read_env_u64(label, "DEVALLOC_FAKE_CUDA_MEMORY_BYTES", uint64_t{1} << 30,
                                    &memory) ||
      !devalloc::fake::read_env_u64(label, "DEVALLOC_FAKE_CUDA_DELAY_US", 200, &delay) ||
      count > 64) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // As the driver does on a machine without a GPU.
  if (count == 0) return CUDA_ERROR_NO_DEVICE;
  const char* pageable = std::getenv("DEVALLOC_FAKE_CUDA_PAGEABLE");
  f.stage_pageable = pageable != nullptr && std::strcmp(pageable, "staged") == 0;
  f.delay = std::chrono::microseconds(delay);
  f.heap.reset_devices(count, memory);
  for (uint64_t d = 0; d < count; ++d) {
    Device device;
    device.name = "Fake CUDA Device " + std::to_string(d);
    const unsigned char uuid[16] = {0xfa, 0x4e, 0xc0, 0xda, 0xde, 0x5a, 0x40, 0x00,
                                    0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    static_cast<unsigned char>(d)};
    std::memcpy(device.uuid.bytes, uuid, sizeof uuid);
    const unsigned bus = 0x1a + static_cast<unsigned>(d);
    char pci[32];
    // Upper-case, as the driver writes it.
    std::snprintf(pci, sizeof pci, "%04X:%02X:00.0", bus >> 8, bus & 0xff);
    device.pci_bus_id = pci;
    f.devices.push_back(std::move(device));
  }
  f.initialized = true;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (CUresult r = enter("cuDeviceGetCount")) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(fake().devices.size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = enter("cuDeviceGet")) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult r = enter("cuDeviceGetName")) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s",
                fake().devices[dev].name.c_str());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (CUresult r = enter("cuDeviceTotalMem_v2")) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = fake().heap.total(dev);
  return CUDA_SUCCESS;
}

#ifndef DEVALLOC_FAKE_CUDA_WITHOUT_UUID_V2
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  if (CUresult r = enter("cuDeviceGetUuid_v2")) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *uuid = fake().devices[dev].uuid;
  return CUDA_SUCCESS;
}
#endif

CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  if (CUresult r = enter("cuDeviceGetPCIBusId")) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // The documented minimum.
  if (pciBusId == nullptr || len < 13) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(pciBusId, static_cast<size_t>(len), "%s",
                fake().devices[dev].pci_bus_id.c_str());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (CUresult r = enter("cuDevicePrimaryCtxRetain")) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = fake();
  std::lock_guard lock(f.mutex);
  Device& device = f.devices[dev];
  if (device.primary == nullptr) {
    f.contexts.push_back(std::make_unique<CUctx_st>(dev));
    device.primary = f.contexts.back().get();
  }
  ++device.retains;
  record().created("primary context retain");
  *pctx = device.primary;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (CUresult r = enter("cuDevicePrimaryCtxRelease_v2")) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Fake& f = fake();
  std::vector<CUstream_st*> orphans;
  {
    std::lock_guard lock(f.mutex);
    Device& device = f.devices[dev];
    if (device.retains == 0) {
      record().violation("cuDevicePrimaryCtxRelease_v2(%d): released more often than retained",
                         dev);
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    record().gone("primary context retain");
    if (--device.retains > 0) return CUDA_SUCCESS;
    CUctx_st* ctx = device.primary;
    // The driver reclaims everything with the context. A user whose
    // context failed could free nothing; any other user should have.
    const bool healthy = ctx->sticky == CUDA_SUCCESS;
    for (CUstream_st* stream : f.streams) {
      if (stream->ctx == ctx) orphans.push_back(stream);
    }
    for (CUstream_st* stream : orphans) f.streams.erase(stream);
    record().gone("stream", orphans.size());
    const uint64_t used = f.heap.used(dev);
    const uint64_t live = f.heap.drop_device(dev);
    if (healthy && live > 0) {
      record().violation(
          "%llu allocation(s) (%llu bytes) of device %d still live when its primary context "
          "was released for the last time",
          static_cast<ull>(live), static_cast<ull>(used), dev);
    }
    if (healthy && !orphans.empty()) {
      record().violation(
          "%zu stream(s) of device %d not destroyed before its primary context was released "
          "for the last time",
          orphans.size(), dev);
    }
    ctx->alive = false;
    device.primary = nullptr;
  }
  for (CUstream_st* stream : orphans) stop(stream);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  if (CUresult r = enter("cuCtxPushCurrent_v2")) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lock(fake().mutex);
    bool known = false;
    for (const auto& c : fake().contexts) known = known || c.get() == ctx;
    if (!known) {
      record().violation("cuCtxPushCurrent_v2(%p): not a context",
                static_cast<void*>(ctx));
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (!ctx->alive) {
      record().violation(
          "cuCtxPushCurrent_v2: device %d's primary context was "
          "released for the last time",
          ctx->device);
      return CUDA_ERROR_INVALID_CONTEXT;
    }
  }
  if (context_depth == kMaxContextDepth) {
    record().violation("context stack deeper than %d: a push without its pop?",
              kMaxContextDepth);
    return CUDA_ERROR_INVALID_VALUE;
  }
  context_stack[context_depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (CUresult r = enter("cuCtxPopCurrent_v2")) return r;
  if (context_depth == 0) {
    record().violation(
        "cuCtxPopCurrent_v2 with no context current: a pop without its "
        "push?");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  CUctx_st* popped = context_stack[--context_depth];
  if (pctx != nullptr) *pctx = popped;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  const char* name = "cuMemGetInfo_v2";
  if (CUresult r = enter(name)) return r;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx)) return r;
  *total = fake().heap.total(ctx->device);
  *free = *total - fake().heap.used(ctx->device);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  if (CUresult r = enter("cuStreamCreate")) return r;
  if (phStream == nullptr || (Flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context("cuStreamCreate", &ctx)) return r;
  auto* stream = new CUstream_st(ctx, fake().pause);
  std::lock_guard lock(fake().mutex);
  fake().streams.insert(stream);
  record().created("stream");
  *phStream = stream;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  if (CUresult r = enter("cuStreamDestroy_v2")) return r;
  {
    std::lock_guard lock(fake().mutex);
    if (fake().streams.erase(hStream) == 0) {
      record().violation("cuStreamDestroy_v2(%p): unknown or already destroyed stream",
                static_cast<void*>(hStream));
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  record().gone("stream");
  // The driver would return at once and finish the work later; waiting
  // here keeps the fake simple and is invisible to a correct user.
  stop(hStream);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  const char* name = "cuStreamSynchronize";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx, true)) return r;
  hStream->work.wait_idle();
  return ctx->sticky;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  const char* name = "cuStreamQuery";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx, true)) return r;
  if (const CUresult sticky = ctx->sticky; sticky != CUDA_SUCCESS) return sticky;
  return hStream->work.busy() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn,
                                  void* userData) {
  const char* name = "cuLaunchHostFunc";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx)) return r;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  hStream->work.enqueue([ctx, fn, userData] {
    // Documented: not called once the context has failed.
    if (ctx->sticky != CUDA_SUCCESS) return;
    in_host_function = true;
    fn(userData);
    in_host_function = false;
  });
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  const char* name = "cuMemAlloc_v2";
  if (CUresult r = enter(name)) return r;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx)) return r;
  if (record().take_null_result(name)) {
    *dptr = 0;
    return CUDA_SUCCESS;
  }
  const uint64_t base = fake().heap.allocate(ctx->device, bytesize);
  if (base == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = base;
  after_success(name);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  const char* name = "cuMemFree_v2";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx)) return r;
  return fake().heap.free(ctx->device, dptr) == DeviceHeap::FreeResult::ok
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost,
                                      size_t ByteCount, CUstream hStream) {
  const char* name = "cuMemcpyHtoDAsync_v2";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx)) return r;
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (srcHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = fake();
  auto target = f.heap.range(name, ctx->device, dstDevice, ByteCount);
  if (!target) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t pin = f.heap.pin_for_copy(srcHost, ByteCount);
  const uint64_t number = ++f.copies_issued;
  const auto* src = static_cast<const std::byte*>(srcHost);
  const uint64_t offset = dstDevice - target->base;
  const std::chrono::microseconds delay = f.delay;

  if (pin == 0 && f.stage_pageable) {
    auto staged = std::make_shared<std::vector<std::byte>>(src, src + ByteCount);
    hStream->work.enqueue([=] {
      std::this_thread::sleep_for(delay);
      if (ctx->sticky != CUDA_SUCCESS || take_fault(ctx)) return;
      std::memcpy(target->bytes.get() + offset, staged->data(), ByteCount);
    });
    return CUDA_SUCCESS;
  }

  const SourceSnapshot issued(srcHost, ByteCount);
  hStream->work.enqueue([=] {
    std::this_thread::sleep_for(delay);
    if (ctx->sticky != CUDA_SUCCESS || take_fault(ctx)) {
      fake().heap.unpin(pin);
      return;
    }
    if (!issued.unchanged()) {
      record().violation(
          "source of async copy changed before the copy read it (%s #%llu issued at +%.3f ms, "
          "%zu bytes from %s host memory %p to device %d at 0x%llx)",
          name, static_cast<ull>(number), issued.issued_at_ms(), ByteCount,
          pin ? "pinned" : "pageable", static_cast<const void*>(src), ctx->device,
          static_cast<ull>(dstDevice));
    }
    if (!fake().heap.still_live(*target)) {
      record().violation("device memory 0x%llx was freed before the async copy into it ran (%s #%llu)",
                         static_cast<ull>(dstDevice), name, static_cast<ull>(number));
    } else {
      std::memcpy(target->bytes.get() + offset, src, ByteCount);
    }
    fake().heap.unpin(pin);
  });
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
  const char* name = "cuMemcpyDtoHAsync_v2";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx)) return r;
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (dstHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = fake();
  auto source = f.heap.range(name, ctx->device, srcDevice, ByteCount);
  if (!source) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t pin = f.heap.pin_for_copy(dstHost, ByteCount);
  const uint64_t offset = srcDevice - source->base;
  auto* dst = static_cast<std::byte*>(dstHost);
  const std::chrono::microseconds delay = f.delay;
  const uint64_t ticket = hStream->work.enqueue([=] {
    std::this_thread::sleep_for(delay);
    if (ctx->sticky == CUDA_SUCCESS && !take_fault(ctx)) {
      if (!fake().heap.still_live(*source)) {
        record().violation("device memory 0x%llx was freed before the async copy from it ran",
                           static_cast<ull>(srcDevice));
      } else {
        std::memcpy(dst, source->bytes.get() + offset, ByteCount);
      }
    }
    fake().heap.unpin(pin);
  });
  // Documented: to pageable memory the copy is complete when this returns.
  if (pin == 0) {
    hStream->work.wait_for(ticket);
    return ctx->sticky;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  const char* name = "cuMemHostAlloc";
  if (CUresult r = enter(name)) return r;
  (void)Flags;
  if (pp == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx)) return r;
  if (record().take_null_result(name)) {
    *pp = nullptr;
    return CUDA_SUCCESS;
  }
  void* memory = fake().heap.pin_allocate(bytesize);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  *pp = memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  if (CUresult r = enter("cuMemFreeHost")) return r;
  return fake().heap.pin_free("cuMemFreeHost", p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ---------------------------------------------------------------------------
// The test's view: fake_cuda_control.h.

int devalloc_fake_cuda_violations(char* buf, size_t cap) {
  return record().violations(buf, cap);
}

void devalloc_fake_cuda_reset(void) {
  record().reset();
  {
    std::lock_guard lock(fake().fault_mutex);
    fake().fault_next_copy = CUDA_SUCCESS;
  }
  devalloc_fake_cuda_pause(0);
}

void devalloc_fake_cuda_fail_next(const char* entry_point, int result) {
  record().fail_calls(entry_point, result, 1);
}

void devalloc_fake_cuda_fail_calls(const char* entry_point, int result, int count) {
  record().fail_calls(entry_point, result, count);
}

void devalloc_fake_cuda_fail_calls_after(const char* entry_point, int skip, int result,
                                         int count) {
  record().fail_calls(entry_point, result, count, skip);
}

void devalloc_fake_cuda_null_result_next(const char* entry_point) {
  record().null_result_next(entry_point);
}

void devalloc_fake_cuda_after_next(const char* entry_point, void (*hook)(void)) {
  std::lock_guard lock(fake().fault_mutex);
  fake().hook_entry_point = entry_point;
  fake().hook = hook;
}

void devalloc_fake_cuda_fault_next_copy(int result) {
  std::lock_guard lock(fake().fault_mutex);
  fake().fault_next_copy = static_cast<CUresult>(result);
}

void devalloc_fake_cuda_pause(int paused) {
  fake().pause.set(paused != 0);
  if (!paused) wake_all_streams();
}

uint64_t devalloc_fake_cuda_calls(const char* entry_point) {
  return record().calls(entry_point);
}

uint64_t devalloc_fake_cuda_live_allocations(int device) { return fake().heap.live(device); }

int devalloc_fake_cuda_live_objects(char* buf, size_t cap) {
  return record().live_objects(buf, cap);
}

int devalloc_fake_cuda_context_depth(void) { return context_depth; }

int devalloc_fake_cuda_read(uint64_t address, void* dst, size_t nbytes) {
  return fake().heap.read(address, dst, nbytes);
}
