#include "cuda_device.hpp"

#include <devalloc/plugin_kit/abi_glue.hpp>
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/give_back.hpp>

#include <cstring>
#include <utility>

namespace devalloc::cuda {

namespace {

using plugin::CallKind;
using plugin::give_back;
using ull = unsigned long long;

CUresult as_cuda(int result) { return static_cast<CUresult>(result); }

}  // namespace

ContextScope::ContextScope(const Driver& driver, CUcontext context, uint32_t ordinal)
    : driver_(driver) {
  driver.check(driver.cuCtxPushCurrent_v2(context), CallKind::work,
               "device %u: cuCtxPushCurrent_v2(ctx = primary context)", ordinal);
  pushed_ = true;
}

// A failed push on a destroy path is retried: the context is gone only when
// it keeps failing.
ContextScope::ContextScope(const Driver& driver, CUcontext context, std::nothrow_t) noexcept
    : driver_(driver) {
  pushed_ = give_back([&] { return driver.cuCtxPushCurrent_v2(context); }) == CUDA_SUCCESS;
}

// A pop that failed once would leave the plugin's context current on the
// caller's thread, under the caller's own: retried.
ContextScope::~ContextScope() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  give_back([&] { return driver_.cuCtxPopCurrent_v2(&popped); });
}

CudaDevice::CudaDevice(const Driver& driver, uint32_t ordinal)
    : driver_(driver), ordinal_(ordinal) {
  const int index = static_cast<int>(ordinal);
  driver.check(driver.cuDeviceGet(&device_, index), CallKind::work, "cuDeviceGet(ordinal = %d)",
               index);

  char name[DEVALLOC_DEVICE_NAME_CAPACITY] = {};
  driver.check(driver.cuDeviceGetName(name, static_cast<int>(sizeof name), device_),
               CallKind::work, "device %u: cuDeviceGetName(len = %zu)", ordinal, sizeof name);
  name[sizeof name - 1] = '\0';
  description_.name = name;

  size_t total = 0;
  driver.check(driver.cuDeviceTotalMem_v2(&total, device_), CallKind::work,
               "device %u: cuDeviceTotalMem_v2", ordinal);
  description_.total_memory_bytes = total;

  CUuuid uuid = {};
  driver.check(driver.cuDeviceGetUuid_v2(&uuid, device_), CallKind::work,
               "device %u: cuDeviceGetUuid_v2", ordinal);
  std::memcpy(description_.uuid.data(), uuid.bytes, description_.uuid.size());

  // 13 characters are documented as enough; leave room for wider domains.
  char pci[DEVALLOC_PCI_BUS_ID_CAPACITY] = {};
  driver.check(driver.cuDeviceGetPCIBusId(pci, static_cast<int>(sizeof pci), device_),
               CallKind::work, "device %u: cuDeviceGetPCIBusId(len = %zu)", ordinal, sizeof pci);
  pci[sizeof pci - 1] = '\0';
  description_.pci_bus_id = plugin::normalize_pci_bus_id(pci);
  description_.dlpack_device_type = DEVALLOC_DLPACK_CUDA;
  description_.dlpack_device_id = index;

  driver.check(driver.cuDevicePrimaryCtxRetain(&context_, device_), CallKind::work,
               "device %u: cuDevicePrimaryCtxRetain", ordinal);
  try {
    ContextScope scope(driver, context_, ordinal);
    driver.check(driver.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CallKind::work,
                 "device %u: cuStreamCreate(Flags = CU_STREAM_NON_BLOCKING)", ordinal);
  } catch (...) {
    give_back([&] { return driver.cuDevicePrimaryCtxRelease_v2(device_); });
    throw;
  }
}

CudaDevice::~CudaDevice() {
  quiesce();
  {
    ContextScope scope(driver_, context_, std::nothrow);
    // Without the context nothing can be freed; releasing it below lets
    // the driver reclaim all of it.
    if (scope.pushed()) {
      allocations_.for_each([&](const plugin::AllocationTable::Allocation& a) {
        give_back([&] { return driver_.cuMemFree_v2(a.base); });
      });
    }
  }
  allocations_.clear();
  give_back([&] { return driver_.cuDevicePrimaryCtxRelease_v2(device_); });
}

plugin::MemoryInfo CudaDevice::memory_info() const {
  ContextScope scope(driver_, context_, ordinal_);
  size_t free_bytes = 0, total_bytes = 0;
  driver_.check(driver_.cuMemGetInfo_v2(&free_bytes, &total_bytes), CallKind::work,
                "device %u: cuMemGetInfo_v2", ordinal_);
  return {free_bytes, total_bytes};
}

uint64_t CudaDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  const uint64_t request = plugin::over_allocation(nbytes, alignment, kNaturalAlignment);
  ContextScope scope(driver_, context_, ordinal_);
  CUdeviceptr base = 0;
  const std::string call = plugin::format("device %u: cuMemAlloc_v2(bytesize = %llu)", ordinal_,
                                          static_cast<ull>(request));
  driver_.check(driver_.cuMemAlloc_v2(&base, request), CallKind::device_allocation, "%s",
                call.c_str());
  plugin::require_memory(base != 0, call, "CUDA_SUCCESS");
  // The context is still current if recording fails and base is freed.
  return allocations_.adopt(
      base, nbytes, alignment,
      [this](uint64_t b) { give_back([&] { return driver_.cuMemFree_v2(b); }); }, call);
}

void CudaDevice::deallocate(uint64_t address) {
  ContextScope scope(driver_, context_, ordinal_);
  allocations_.free(address, [this](uint64_t base) {
    driver_.check(driver_.cuMemFree_v2(base), CallKind::work,
                  "device %u: cuMemFree_v2(dptr = 0x%llx)", ordinal_, static_cast<ull>(base));
  });
}

void CudaDevice::copy_during_call(uint64_t dst, const void* src, uint64_t nbytes) {
  allocations_.require_range(dst, nbytes, "destination");
  ContextScope scope(driver_, context_, ordinal_);
  // Not cuMemcpyHtoD_v2: it runs on the legacy default stream, which a
  // non-blocking stream does not order against, and from pageable memory it
  // may return before the bytes have landed; synchronize() would then not
  // cover it. Queued on the device's stream and waited for, the copy has
  // read src, pageable or pinned, when the stream is idle.
  driver_.check(as_cuda(enqueue_copy(dst, src, nbytes)), CallKind::work,
                "device %u: cuMemcpyHtoDAsync_v2(dstDevice = 0x%llx, srcHost = %p, ByteCount = "
                "%llu, hStream = device stream)",
                ordinal_, static_cast<ull>(dst), src, static_cast<ull>(nbytes));
  driver_.check(as_cuda(releases_.wait_until_over()), CallKind::work,
                "device %u: cuStreamSynchronize(hStream = device stream) after a copy of %llu "
                "bytes to 0x%llx",
                ordinal_, static_cast<ull>(nbytes), static_cast<ull>(dst));
}

void CudaDevice::copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                                     plugin::Release release) {
  allocations_.require_range(dst, nbytes, "destination");
  ContextScope scope(driver_, context_, ordinal_);
  const auto submitted = releases_.copy_until_released(dst, src, nbytes, std::move(release));
  driver_.check(as_cuda(submitted.copied), CallKind::work,
                "device %u: cuMemcpyHtoDAsync_v2(dstDevice = 0x%llx, srcHost = %p, ByteCount = "
                "%llu, hStream = device stream)",
                ordinal_, static_cast<ull>(dst), src, static_cast<ull>(nbytes));
  driver_.check(as_cuda(submitted.released), CallKind::work,
                "device %u: cuLaunchHostFunc(hStream = device stream) after a copy of %llu "
                "bytes to 0x%llx",
                ordinal_, static_cast<ull>(nbytes), static_cast<ull>(dst));
}

void CudaDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  allocations_.require_range(src, nbytes, "source");
  ContextScope scope(driver_, context_, ordinal_);
  // On the device's stream, so that it reads after every earlier copy.
  driver_.check(driver_.cuMemcpyDtoHAsync_v2(dst, src, nbytes, stream_), CallKind::work,
                "device %u: cuMemcpyDtoHAsync_v2(dstHost = %p, srcDevice = 0x%llx, ByteCount = "
                "%llu, hStream = device stream)",
                ordinal_, dst, static_cast<ull>(src), static_cast<ull>(nbytes));
  driver_.check(as_cuda(releases_.wait_until_over()), CallKind::work,
                "device %u: cuStreamSynchronize(hStream = device stream) after a copy of %llu "
                "bytes from 0x%llx",
                ordinal_, static_cast<ull>(nbytes), static_cast<ull>(src));
}

void CudaDevice::synchronize() {
  ContextScope scope(driver_, context_, ordinal_);
  driver_.check(as_cuda(releases_.wait_until_over()), CallKind::work,
                "device %u: cuStreamSynchronize(hStream = device stream)", ordinal_);
}

void CudaDevice::quiesce() noexcept {
  ContextScope scope(driver_, context_, std::nothrow);
  releases_.quiesce(scope.pushed());
}

int CudaDevice::enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept {
  return driver_.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream_);
}

int CudaDevice::enqueue_release(plugin::ReleaseQueue& releases) noexcept {
  return driver_.cuLaunchHostFunc(stream_, &CudaDevice::release_oldest, &releases);
}

int CudaDevice::wait() noexcept { return driver_.cuStreamSynchronize(stream_); }

CudaDevice::State CudaDevice::query() noexcept {
  switch (driver_.cuStreamQuery(stream_)) {
    case CUDA_SUCCESS:
      return State::idle;
    case CUDA_ERROR_NOT_READY:
      return State::busy;
    default:
      // A context with a sticky error reports it for every call; host
      // functions never run in it again.
      return State::lost;
  }
}

void CudaDevice::destroy() noexcept {
  give_back([&] { return driver_.cuStreamDestroy_v2(stream_); });
}

void CudaDevice::release_oldest(void* releases) {
  static_cast<plugin::ReleaseQueue*>(releases)->complete_oldest();
}

std::vector<std::unique_ptr<CudaDevice>> open_devices(const Driver& driver) {
  std::vector<std::unique_ptr<CudaDevice>> devices;
  const CUresult initialized = driver.cuInit(0);
  if (initialized == CUDA_ERROR_NO_DEVICE) return devices;
  driver.check(initialized, CallKind::work, "cuInit(Flags = 0)");
  int count = 0;
  const CUresult counted = driver.cuDeviceGetCount(&count);
  if (counted == CUDA_ERROR_NO_DEVICE) return devices;
  driver.check(counted, CallKind::work, "cuDeviceGetCount");
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    devices.push_back(std::make_unique<CudaDevice>(driver, static_cast<uint32_t>(ordinal)));
  }
  return devices;
}

PinnedHostMemory::~PinnedHostMemory() {
  if (buffers_.size() == 0) return;
  ContextScope scope(driver_, owner_.context(), std::nothrow);
  // Without the context, releasing the primary context reclaims it.
  if (scope.pushed()) {
    buffers_.for_each([&](void* host, uint64_t) {
      give_back([&] { return driver_.cuMemFreeHost(host); });
    });
  }
  buffers_.clear();
}

void* PinnedHostMemory::allocate(uint64_t nbytes) {
  ContextScope scope(driver_, owner_.context(), owner_.ordinal());
  void* host = nullptr;
  // Portable: the memory is pinned for every context, not only the first
  // device's, so that copies to any device run from it at full speed.
  const std::string call =
      plugin::format("cuMemHostAlloc(bytesize = %llu, Flags = CU_MEMHOSTALLOC_PORTABLE)",
                     static_cast<ull>(nbytes));
  driver_.check(driver_.cuMemHostAlloc(&host, nbytes, CU_MEMHOSTALLOC_PORTABLE),
                CallKind::host_allocation, "%s", call.c_str());
  plugin::require_memory(host != nullptr, call, "CUDA_SUCCESS");
  buffers_.adopt(
      host, nbytes, [this](void* p) { give_back([&] { return driver_.cuMemFreeHost(p); }); },
      call);
  return host;
}

void PinnedHostMemory::free(void* host) {
  ContextScope scope(driver_, owner_.context(), owner_.ordinal());
  buffers_.free(host, [this](void* p) {
    driver_.check(driver_.cuMemFreeHost(p), CallKind::work, "cuMemFreeHost(p = %p)", p);
  });
}

}  // namespace devalloc::cuda
