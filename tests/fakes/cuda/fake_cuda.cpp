// A fake CUDA driver: the part of the driver API that devalloc's CUDA plugin
// uses, built as libcuda.so.1. Device memory lives on the host heap behind
// addresses the host cannot dereference; every stream runs its work later,
// on a thread of its own. Wherever a plugin could be wrong and still pass on
// real hardware by luck, the fake is strict and records a violation instead:
// README.md lists each rule and where it is stricter than the driver.
//
// Variants, from this one source:
//   DEVALLOC_FAKE_CUDA_INIT_RESULT=<CUresult>  cuInit always fails with it.
//   DEVALLOC_FAKE_CUDA_WITHOUT_UUID_V2         no cuDeviceGetUuid_v2, as in
//                                              a driver older than CUDA 11.4.
#include <cuda.h>

#include "fake_cuda_control.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

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
  explicit CUstream_st(CUctx_st* c) : ctx(c) {}
  CUctx_st* const ctx;
  std::mutex mutex;
  std::condition_variable wake;  // the worker waits for work
  std::condition_variable idle;  // synchronizers wait for progress
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  bool stopping = false;
  std::thread worker;
};

namespace {

using Clock = std::chrono::steady_clock;
using ull = unsigned long long;

// Device addresses are non-canonical on x86-64 (bit 47 set, bits 48-63
// clear): a host dereference faults instead of touching host memory.
constexpr uint64_t kAddressBase = uint64_t{1} << 47;
constexpr uint64_t kDeviceSpan = uint64_t{1} << 40;
constexpr int kMaxContextDepth = 64;

struct Allocation {
  int device = 0;
  uint64_t base = 0;
  uint64_t size = 0;
  // Shared with copies in flight, which may outlive a (wrong) free.
  std::shared_ptr<std::byte[]> bytes;
  bool freed = false;
};

struct PinnedBlock {
  void* memory = nullptr;
  size_t size = 0;
  int copies_in_flight = 0;
  // Freed while copies still used it: the memory stays until they are done.
  bool freed = false;
};

struct Device {
  std::string name;
  CUuuid uuid = {};
  std::string pci_bus_id;
  uint64_t total = 0;
  uint64_t used = 0;
  CUctx_st* primary = nullptr;
  int retains = 0;
  uint64_t next_address = 0;
};

struct Fake {
  // Devices, contexts, memory and the set of streams.
  std::mutex mutex;
  std::atomic<bool> initialized{false};
  std::chrono::microseconds delay{200};
  bool stage_pageable = false;
  std::vector<Device> devices;
  std::vector<std::unique_ptr<CUctx_st>> contexts;
  // By base address; freed ones stay, as addresses are never reused.
  std::map<uint64_t, std::shared_ptr<Allocation>> allocations;
  std::map<uintptr_t, PinnedBlock> pinned;
  std::set<CUstream_st*> streams;
  std::atomic<bool> paused{false};
  uint64_t copies_issued = 0;
  const Clock::time_point start = Clock::now();

  // What tests see and steer; a leaf lock, taken after `mutex` if both.
  std::mutex control_mutex;
  std::vector<std::string> violations;
  std::map<std::string, uint64_t> calls;
  std::map<std::string, CUresult> fail_next;
  CUresult fault_next_copy = CUDA_SUCCESS;
};

// Never destroyed: stream threads and the unload hook use it until the end.
Fake& fake() {
  static Fake* instance = new Fake;
  return *instance;
}

thread_local CUctx_st* context_stack[kMaxContextDepth];
thread_local int context_depth = 0;
thread_local bool in_host_function = false;

void violation(const char* format, ...) __attribute__((format(printf, 1, 2)));
void violation(const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  std::lock_guard lock(fake().control_mutex);
  fake().violations.emplace_back(text);
}

double milliseconds_since_start() {
  return std::chrono::duration<double, std::milli>(Clock::now() - fake().start)
      .count();
}

// Word-wise FNV-1a: fast enough to hash every source twice.
uint64_t hash_bytes(const void* data, size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    h = (h ^ word) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

// Counts the call, then refuses it when it comes from a host function, was
// told to fail, or precedes cuInit.
CUresult enter(const char* name, bool needs_init = true) {
  Fake& f = fake();
  {
    std::lock_guard lock(f.control_mutex);
    ++f.calls[name];
  }
  if (in_host_function) {
    violation(
        "%s called from a host function; cuLaunchHostFunc forbids CUDA "
        "calls there",
        name);
    return CUDA_ERROR_NOT_PERMITTED;
  }
  {
    std::lock_guard lock(f.control_mutex);
    if (auto it = f.fail_next.find(name); it != f.fail_next.end()) {
      const CUresult result = it->second;
      f.fail_next.erase(it);
      return result;
    }
  }
  if (needs_init && !f.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

bool valid_device(CUdevice device) {
  return device >= 0 && device < static_cast<int>(fake().devices.size());
}

CUresult current_context(const char* name, CUctx_st** out,
                         bool allow_sticky = false) {
  if (context_depth == 0) {
    violation("%s called with no context current", name);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  CUctx_st* ctx = context_stack[context_depth - 1];
  {
    std::lock_guard lock(fake().mutex);
    if (!ctx->alive) {
      violation(
          "%s called with a destroyed context current (device %d's "
          "primary context, released)",
          name, ctx->device);
      return CUDA_ERROR_INVALID_CONTEXT;
    }
  }
  if (!allow_sticky) {
    if (const CUresult sticky = ctx->sticky; sticky != CUDA_SUCCESS)
      return sticky;
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
    violation(
        "%s on the legacy default stream, which the fake does not "
        "implement",
        name);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  {
    std::lock_guard lock(fake().mutex);
    if (fake().streams.count(stream) == 0) {
      violation("%s on an unknown or destroyed stream %p", name,
                static_cast<void*>(stream));
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx, allow_sticky)) return r;
  if (ctx != stream->ctx) {
    violation(
        "%s on a stream of device %d while device %d's context is "
        "current",
        name, stream->ctx->device, ctx->device);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *out = ctx;
  return CUDA_SUCCESS;
}

// The live allocation of `device` that holds [address, address + n), or a
// violation and nullptr.
std::shared_ptr<Allocation> device_range(const char* name, int device,
                                         uint64_t address, uint64_t n) {
  std::lock_guard lock(fake().mutex);
  auto& allocations = fake().allocations;
  auto it = allocations.upper_bound(address);
  if (it != allocations.begin()) {
    const auto& a = std::prev(it)->second;
    const bool inside =
        address - a->base < a->size && n <= a->size - (address - a->base);
    if (inside && a->freed) {
      violation(
          "%s: [0x%llx, +%llu) lies in freed device memory (allocation "
          "0x%llx of %llu bytes)",
          name, static_cast<ull>(address), static_cast<ull>(n),
          static_cast<ull>(a->base), static_cast<ull>(a->size));
      return nullptr;
    }
    if (inside && a->device != device) {
      violation(
          "%s: [0x%llx, +%llu) is memory of device %d, the stream's "
          "context is device %d's",
          name, static_cast<ull>(address), static_cast<ull>(n), a->device,
          device);
      return nullptr;
    }
    if (inside) return a;
  }
  violation("%s: [0x%llx, +%llu) is outside every live allocation", name,
            static_cast<ull>(address), static_cast<ull>(n));
  return nullptr;
}

// The pinned block that holds [p, p + n), counted as used by one more copy
// in flight; 0 for pageable memory.
uintptr_t pin_for_copy(const void* p, size_t n) {
  std::lock_guard lock(fake().mutex);
  auto& pinned = fake().pinned;
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = pinned.upper_bound(address);
  if (it == pinned.begin()) return 0;
  --it;
  PinnedBlock& block = it->second;
  if (block.freed || address - it->first >= block.size ||
      n > block.size - (address - it->first)) {
    return 0;
  }
  ++block.copies_in_flight;
  return it->first;
}

void unpin_after_copy(uintptr_t key) {
  if (key == 0) return;
  std::lock_guard lock(fake().mutex);
  auto it = fake().pinned.find(key);
  PinnedBlock& block = it->second;
  if (--block.copies_in_flight == 0 && block.freed) {
    std::free(block.memory);
    fake().pinned.erase(it);
  }
}

// True when the next executed copy is to fail; the context keeps the error.
bool take_fault(CUctx_st* ctx) {
  std::lock_guard lock(fake().control_mutex);
  if (fake().fault_next_copy == CUDA_SUCCESS) return false;
  ctx->sticky = fake().fault_next_copy;
  fake().fault_next_copy = CUDA_SUCCESS;
  return true;
}

void run_stream(CUstream_st* stream) {
  std::unique_lock lock(stream->mutex);
  for (;;) {
    stream->wake.wait(lock, [stream] {
      return stream->stopping ||
             (!stream->queue.empty() && !fake().paused.load());
    });
    if (stream->queue.empty()) return;
    auto op = std::move(stream->queue.front());
    stream->queue.pop_front();
    lock.unlock();
    op();
    lock.lock();
    ++stream->completed;
    stream->idle.notify_all();
  }
}

uint64_t enqueue(CUstream_st* stream, std::function<void()> op) {
  std::lock_guard lock(stream->mutex);
  stream->queue.push_back(std::move(op));
  stream->wake.notify_one();
  return ++stream->enqueued;
}

void wait_for(CUstream_st* stream, uint64_t ticket) {
  std::unique_lock lock(stream->mutex);
  stream->idle.wait(lock, [&] { return stream->completed >= ticket; });
}

void stop(CUstream_st* stream) {
  {
    std::lock_guard lock(stream->mutex);
    stream->stopping = true;
    stream->wake.notify_one();
  }
  stream->worker.join();
  delete stream;
}

void wake_all_streams() {
  std::lock_guard lock(fake().mutex);
  for (CUstream_st* stream : fake().streams) {
    std::lock_guard stream_lock(stream->mutex);
    stream->wake.notify_one();
  }
}

bool read_env(const char* name, uint64_t fallback, uint64_t* value) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    *value = fallback;
    return true;
  }
  char* end = nullptr;
  *value = std::strtoull(text, &end, 10);
  if (*end != '\0' || *text == '-') {
    std::fprintf(stderr,
                 "fake libcuda: %s=\"%s\" is not a non-negative "
                 "integer\n",
                 name, text);
    return false;
  }
  return true;
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
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
     "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
     "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
     "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
     "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE",
     "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED",
     "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED",
     "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
     "operation not supported"},
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
  std::vector<CUstream_st*> streams;
  {
    std::lock_guard lock(f.mutex);
    streams.assign(f.streams.begin(), f.streams.end());
    f.streams.clear();
    for (size_t d = 0; d < f.devices.size(); ++d) {
      if (f.devices[d].retains > 0) {
        violation(
            "device %zu's primary context is still retained %d time(s) "
            "at exit (%llu bytes of device memory in use)",
            d, f.devices[d].retains, static_cast<ull>(f.devices[d].used));
      }
    }
    for (const auto& [address, block] : f.pinned) {
      if (!block.freed) {
        violation("pinned host memory %p (%zu bytes) never freed", block.memory,
                  block.size);
      }
    }
  }
  if (!streams.empty()) {
    violation("%zu stream(s) never destroyed", streams.size());
    f.paused = false;
    for (CUstream_st* stream : streams) stop(stream);
  }
  const char* strict = std::getenv("DEVALLOC_FAKE_CUDA_STRICT");
  if (strict == nullptr || std::strcmp(strict, "1") != 0) return;
  std::lock_guard lock(f.control_mutex);
  if (f.violations.empty()) return;
  std::fprintf(stderr, "fake libcuda: %zu violation(s):\n",
               f.violations.size());
  for (const auto& v : f.violations) std::fprintf(stderr, "  %s\n", v.c_str());
  std::fflush(stderr);
  ::_exit(3);
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
  uint64_t count = 0, memory = 0, delay = 0;
  if (!read_env("DEVALLOC_FAKE_CUDA_DEVICES", 2, &count) ||
      !read_env("DEVALLOC_FAKE_CUDA_MEMORY_BYTES", uint64_t{1} << 30,
                &memory) ||
      !read_env("DEVALLOC_FAKE_CUDA_DELAY_US", 200, &delay) || count > 64) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // As the driver does on a machine without a GPU.
  if (count == 0) return CUDA_ERROR_NO_DEVICE;
  const char* pageable = std::getenv("DEVALLOC_FAKE_CUDA_PAGEABLE");
  f.stage_pageable =
      pageable != nullptr && std::strcmp(pageable, "staged") == 0;
  f.delay = std::chrono::microseconds(delay);
  for (uint64_t d = 0; d < count; ++d) {
    Device device;
    device.name = "Fake CUDA Device " + std::to_string(d);
    const unsigned char uuid[16] = {
        0xfa, 0x4e, 0xc0, 0xda,
        0xde, 0x5a, 0x40, 0x00,
        0x80, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, static_cast<unsigned char>(d)};
    std::memcpy(device.uuid.bytes, uuid, sizeof uuid);
    const unsigned bus = 0x1a + static_cast<unsigned>(d);
    char pci[32];
    // Upper-case, as the driver writes it.
    std::snprintf(pci, sizeof pci, "%04X:%02X:00.0", bus >> 8, bus & 0xff);
    device.pci_bus_id = pci;
    device.total = memory;
    device.next_address = kAddressBase + d * kDeviceSpan;
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
  *bytes = fake().devices[dev].total;
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
      violation(
          "cuDevicePrimaryCtxRelease_v2(%d): released more often than "
          "retained",
          dev);
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (--device.retains > 0) return CUDA_SUCCESS;
    CUctx_st* ctx = device.primary;
    // The driver reclaims everything with the context. A user whose
    // context failed could free nothing; any other user should have.
    const bool healthy = ctx->sticky == CUDA_SUCCESS;
    for (CUstream_st* stream : f.streams) {
      if (stream->ctx == ctx) orphans.push_back(stream);
    }
    for (CUstream_st* stream : orphans) f.streams.erase(stream);
    uint64_t live = 0;
    for (auto& [base, a] : f.allocations) {
      if (a->device == dev && !a->freed) {
        ++live;
        a->freed = true;
        a->bytes.reset();
      }
    }
    if (healthy && live > 0) {
      violation(
          "%llu allocation(s) (%llu bytes) of device %d still live when "
          "its primary context was released for the last time",
          static_cast<ull>(live), static_cast<ull>(device.used), dev);
    }
    if (healthy && !orphans.empty()) {
      violation(
          "%zu stream(s) of device %d not destroyed before its primary "
          "context was released for the last time",
          orphans.size(), dev);
    }
    device.used = 0;
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
      violation("cuCtxPushCurrent_v2(%p): not a context",
                static_cast<void*>(ctx));
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (!ctx->alive) {
      violation(
          "cuCtxPushCurrent_v2: device %d's primary context was "
          "released for the last time",
          ctx->device);
      return CUDA_ERROR_INVALID_CONTEXT;
    }
  }
  if (context_depth == kMaxContextDepth) {
    violation("context stack deeper than %d: a push without its pop?",
              kMaxContextDepth);
    return CUDA_ERROR_INVALID_VALUE;
  }
  context_stack[context_depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (CUresult r = enter("cuCtxPopCurrent_v2")) return r;
  if (context_depth == 0) {
    violation(
        "cuCtxPopCurrent_v2 with no context current: a pop without its "
        "push?");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  CUctx_st* popped = context_stack[--context_depth];
  if (pctx != nullptr) *pctx = popped;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  if (CUresult r = enter("cuStreamCreate")) return r;
  if (phStream == nullptr || (Flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context("cuStreamCreate", &ctx)) return r;
  auto* stream = new CUstream_st(ctx);
  stream->worker = std::thread(run_stream, stream);
  std::lock_guard lock(fake().mutex);
  fake().streams.insert(stream);
  *phStream = stream;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  if (CUresult r = enter("cuStreamDestroy_v2")) return r;
  {
    std::lock_guard lock(fake().mutex);
    if (fake().streams.erase(hStream) == 0) {
      violation("cuStreamDestroy_v2(%p): unknown or already destroyed stream",
                static_cast<void*>(hStream));
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
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
  uint64_t ticket = 0;
  {
    std::lock_guard lock(hStream->mutex);
    ticket = hStream->enqueued;
  }
  wait_for(hStream, ticket);
  return ctx->sticky;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn,
                                  void* userData) {
  const char* name = "cuLaunchHostFunc";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx)) return r;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  enqueue(hStream, [ctx, fn, userData] {
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
  Fake& f = fake();
  std::lock_guard lock(f.mutex);
  Device& device = f.devices[ctx->device];
  if (bytesize > device.total - device.used) return CUDA_ERROR_OUT_OF_MEMORY;
  auto allocation = std::make_shared<Allocation>();
  allocation->bytes.reset(new (std::nothrow) std::byte[bytesize]);
  if (!allocation->bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  // Exactly 256-aligned, never 512: a user that needs more must round up.
  // A gap of a page after each allocation keeps overruns out of the next.
  const uint64_t base = ((device.next_address + 511) & ~uint64_t{511}) + 256;
  device.next_address = base + ((bytesize + 255) & ~uint64_t{255}) + 4096;
  device.used += bytesize;
  allocation->device = ctx->device;
  allocation->base = base;
  allocation->size = bytesize;
  f.allocations.emplace(base, std::move(allocation));
  *dptr = base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  const char* name = "cuMemFree_v2";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx)) return r;
  Fake& f = fake();
  std::lock_guard lock(f.mutex);
  auto it = f.allocations.find(dptr);
  if (it == f.allocations.end()) {
    violation("cuMemFree_v2(0x%llx): not an address cuMemAlloc_v2 returned",
              static_cast<ull>(dptr));
    return CUDA_ERROR_INVALID_VALUE;
  }
  Allocation& a = *it->second;
  if (a.freed) {
    violation("cuMemFree_v2(0x%llx): double free", static_cast<ull>(dptr));
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (a.device != ctx->device) {
    violation(
        "cuMemFree_v2(0x%llx): memory of device %d freed with device "
        "%d's context current",
        static_cast<ull>(dptr), a.device, ctx->device);
  }
  a.freed = true;
  a.bytes.reset();
  f.devices[a.device].used -= a.size;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice,
                                      const void* srcHost, size_t ByteCount,
                                      CUstream hStream) {
  const char* name = "cuMemcpyHtoDAsync_v2";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx)) return r;
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (srcHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto target = device_range(name, ctx->device, dstDevice, ByteCount);
  if (!target) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = fake();
  const uintptr_t pin = pin_for_copy(srcHost, ByteCount);
  uint64_t number = 0;
  {
    std::lock_guard lock(f.mutex);
    number = ++f.copies_issued;
  }
  const auto* src = static_cast<const std::byte*>(srcHost);
  const uint64_t offset = dstDevice - target->base;
  const std::chrono::microseconds delay = f.delay;

  if (pin == 0 && f.stage_pageable) {
    auto staged =
        std::make_shared<std::vector<std::byte>>(src, src + ByteCount);
    enqueue(hStream, [=] {
      std::this_thread::sleep_for(delay);
      if (ctx->sticky != CUDA_SUCCESS || take_fault(ctx)) return;
      std::memcpy(target->bytes.get() + offset, staged->data(), ByteCount);
    });
    return CUDA_SUCCESS;
  }

  const uint64_t issued_hash = hash_bytes(srcHost, ByteCount);
  const double issued_at = milliseconds_since_start();
  enqueue(hStream, [=] {
    std::this_thread::sleep_for(delay);
    if (ctx->sticky != CUDA_SUCCESS || take_fault(ctx)) {
      unpin_after_copy(pin);
      return;
    }
    if (hash_bytes(src, ByteCount) != issued_hash) {
      violation(
          "source of async copy changed before the copy read it "
          "(%s #%llu issued at +%.3f ms, %zu bytes from %s host memory "
          "%p to device %d at 0x%llx)",
          name, static_cast<ull>(number), issued_at, ByteCount,
          pin ? "pinned" : "pageable", static_cast<const void*>(src),
          ctx->device, static_cast<ull>(dstDevice));
    }
    bool freed = false;
    {
      std::lock_guard lock(fake().mutex);
      freed = target->freed;
    }
    if (freed) {
      violation(
          "device memory 0x%llx was freed before the async copy into "
          "it ran (%s #%llu)",
          static_cast<ull>(dstDevice), name, static_cast<ull>(number));
    } else {
      std::memcpy(target->bytes.get() + offset, src, ByteCount);
    }
    unpin_after_copy(pin);
  });
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice,
                                      size_t ByteCount, CUstream hStream) {
  const char* name = "cuMemcpyDtoHAsync_v2";
  if (CUresult r = enter(name)) return r;
  CUctx_st* ctx = nullptr;
  if (CUresult r = stream_context(name, hStream, &ctx)) return r;
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (dstHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto source = device_range(name, ctx->device, srcDevice, ByteCount);
  if (!source) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t pin = pin_for_copy(dstHost, ByteCount);
  const uint64_t offset = srcDevice - source->base;
  auto* dst = static_cast<std::byte*>(dstHost);
  const std::chrono::microseconds delay = fake().delay;
  const uint64_t ticket = enqueue(hStream, [=] {
    std::this_thread::sleep_for(delay);
    if (ctx->sticky == CUDA_SUCCESS && !take_fault(ctx)) {
      bool freed = false;
      {
        std::lock_guard lock(fake().mutex);
        freed = source->freed;
      }
      if (freed) {
        violation(
            "device memory 0x%llx was freed before the async copy from "
            "it ran",
            static_cast<ull>(srcDevice));
      } else {
        std::memcpy(dst, source->bytes.get() + offset, ByteCount);
      }
    }
    unpin_after_copy(pin);
  });
  // Documented: to pageable memory the copy is complete when this returns.
  if (pin == 0) {
    wait_for(hStream, ticket);
    return ctx->sticky;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize,
                                unsigned int Flags) {
  const char* name = "cuMemHostAlloc";
  if (CUresult r = enter(name)) return r;
  (void)Flags;
  if (pp == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = nullptr;
  if (CUresult r = current_context(name, &ctx)) return r;
  const size_t rounded = (bytesize + 4095) & ~size_t{4095};
  void* memory = std::aligned_alloc(4096, rounded);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lock(fake().mutex);
  PinnedBlock block;
  block.memory = memory;
  block.size = bytesize;
  fake().pinned.emplace(reinterpret_cast<uintptr_t>(memory), block);
  *pp = memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  if (CUresult r = enter("cuMemFreeHost")) return r;
  std::lock_guard lock(fake().mutex);
  auto it = fake().pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == fake().pinned.end() || it->second.freed) {
    violation("cuMemFreeHost(%p): not from cuMemHostAlloc, or already freed",
              p);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (it->second.copies_in_flight > 0) {
    violation("cuMemFreeHost(%p): freed while %d async copy(ies) still use it",
              p, it->second.copies_in_flight);
    it->second.freed = true;
    return CUDA_SUCCESS;
  }
  std::free(it->second.memory);
  fake().pinned.erase(it);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------
// The test's view: fake_cuda_control.h.

int devalloc_fake_cuda_violations(char* buf, size_t cap) {
  Fake& f = fake();
  std::lock_guard lock(f.control_mutex);
  std::string text;
  for (const auto& v : f.violations) text += v + "\n";
  if (buf != nullptr && cap > 0) {
    const size_t n = std::min(text.size(), cap - 1);
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return static_cast<int>(f.violations.size());
}

void devalloc_fake_cuda_reset(void) {
  Fake& f = fake();
  {
    std::lock_guard lock(f.control_mutex);
    f.violations.clear();
    f.calls.clear();
    f.fail_next.clear();
    f.fault_next_copy = CUDA_SUCCESS;
  }
  devalloc_fake_cuda_pause(0);
}

void devalloc_fake_cuda_fail_next(const char* entry_point, int result) {
  std::lock_guard lock(fake().control_mutex);
  fake().fail_next[entry_point] = static_cast<CUresult>(result);
}

void devalloc_fake_cuda_fault_next_copy(int result) {
  std::lock_guard lock(fake().control_mutex);
  fake().fault_next_copy = static_cast<CUresult>(result);
}

void devalloc_fake_cuda_pause(int paused) {
  fake().paused = paused != 0;
  if (!paused) wake_all_streams();
}

uint64_t devalloc_fake_cuda_calls(const char* entry_point) {
  std::lock_guard lock(fake().control_mutex);
  auto it = fake().calls.find(entry_point);
  return it == fake().calls.end() ? 0 : it->second;
}

uint64_t devalloc_fake_cuda_live_allocations(int device) {
  std::lock_guard lock(fake().mutex);
  uint64_t live = 0;
  for (const auto& [base, a] : fake().allocations) {
    if (!a->freed && (device < 0 || a->device == device)) ++live;
  }
  return live;
}

int devalloc_fake_cuda_read(uint64_t address, void* dst, size_t nbytes) {
  std::lock_guard lock(fake().mutex);
  auto& allocations = fake().allocations;
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return -1;
  const Allocation& a = *std::prev(it)->second;
  if (a.freed || address - a.base >= a.size ||
      nbytes > a.size - (address - a.base)) {
    return -1;
  }
  std::memcpy(dst, a.bytes.get() + (address - a.base), nbytes);
  return 0;
}
