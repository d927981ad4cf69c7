#include "hip_device.hpp"

#include <devalloc/plugin_kit/abi_glue.hpp>
#include <devalloc/plugin_kit/give_back.hpp>

#include <cstring>
#include <new>
#include <utility>

namespace devalloc::hip {
namespace {

using plugin::CallKind;
using plugin::give_back;
using ull = unsigned long long;

void* device_pointer(uint64_t address) { return reinterpret_cast<void*>(address); }
uint64_t device_address(void* p) { return reinterpret_cast<uint64_t>(p); }

}  // namespace

DeviceGuard::DeviceGuard(const Runtime& runtime, int ordinal) : runtime_(runtime) {
  runtime.check(runtime.hipGetDevice(&previous_), CallKind::work, "hipGetDevice");
  runtime.check(runtime.hipSetDevice(ordinal), CallKind::work, "hipSetDevice(deviceId = %d)",
                ordinal);
  active_ = true;
}

// For destroy paths: a call that failed once is retried before the device
// counts as unreachable.
DeviceGuard::DeviceGuard(const Runtime& runtime, int ordinal, std::nothrow_t) noexcept
    : runtime_(runtime) {
  active_ = give_back([&] { return runtime.hipGetDevice(&previous_); }) == hipSuccess &&
            give_back([&] { return runtime.hipSetDevice(ordinal); }) == hipSuccess;
}

// A restore that failed once would leave the caller's thread on this
// device: retried.
DeviceGuard::~DeviceGuard() {
  if (active_) static_cast<void>(give_back([&] { return runtime_.hipSetDevice(previous_); }));
}

HipDevice::HipDevice(const Runtime& runtime, int ordinal) : runtime_(runtime), ordinal_(ordinal) {
  char name[DEVALLOC_DEVICE_NAME_CAPACITY] = {};
  runtime.check(runtime.hipDeviceGetName(name, static_cast<int>(sizeof name), ordinal),
                CallKind::work, "hipDeviceGetName(len = %zu, device = %d)", sizeof name, ordinal);
  name[sizeof name - 1] = '\0';
  description_.name = name;

  size_t total = 0;
  runtime.check(runtime.hipDeviceTotalMem(&total, ordinal), CallKind::work,
                "hipDeviceTotalMem(device = %d)", ordinal);
  description_.total_memory_bytes = total;

  hipUUID uuid = {};
  runtime.check(runtime.hipDeviceGetUuid(&uuid, ordinal), CallKind::work,
                "hipDeviceGetUuid(device = %d)", ordinal);
  std::memcpy(description_.uuid.data(), uuid.bytes, description_.uuid.size());

  char pci[DEVALLOC_PCI_BUS_ID_CAPACITY] = {};
  runtime.check(runtime.hipDeviceGetPCIBusId(pci, static_cast<int>(sizeof pci), ordinal),
                CallKind::work, "hipDeviceGetPCIBusId(len = %zu, device = %d)", sizeof pci,
                ordinal);
  pci[sizeof pci - 1] = '\0';
  description_.pci_bus_id = plugin::normalize_pci_bus_id(pci);
  description_.dlpack_device_type = DEVALLOC_DLPACK_ROCM;
  description_.dlpack_device_id = ordinal;

  DeviceGuard guard(runtime, ordinal);
  runtime.check(runtime.hipStreamCreateWithFlags(&stream_, hipStreamNonBlocking), CallKind::work,
                "hipStreamCreateWithFlags(flags = hipStreamNonBlocking) on device %d", ordinal);
}

HipDevice::~HipDevice() {
  quiesce();
  DeviceGuard guard(runtime_, ordinal_, std::nothrow);
  if (guard.active()) {
    allocations_.for_each([&](const plugin::AllocationTable::Allocation& a) {
      static_cast<void>(give_back([&] { return runtime_.hipFree(device_pointer(a.base)); }));
    });
  }
  allocations_.clear();
}

plugin::MemoryInfo HipDevice::memory_info() const {
  DeviceGuard guard(runtime_, ordinal_);
  size_t free_bytes = 0, total_bytes = 0;
  runtime_.check(runtime_.hipMemGetInfo(&free_bytes, &total_bytes), CallKind::work,
                 "hipMemGetInfo on device %d", ordinal_);
  return {free_bytes, total_bytes};
}

uint64_t HipDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  const uint64_t request = plugin::over_allocation(nbytes, alignment, kNaturalAlignment);
  DeviceGuard guard(runtime_, ordinal_);
  void* base = nullptr;
  const std::string call =
      plugin::format("hipMalloc(size = %llu) on device %d", static_cast<ull>(request), ordinal_);
  runtime_.check(runtime_.hipMalloc(&base, request), CallKind::device_allocation, "%s",
                 call.c_str());
  plugin::require_memory(base != nullptr, call, "hipSuccess");
  return allocations_.adopt(
      device_address(base), nbytes, alignment,
      [this](uint64_t b) {
        static_cast<void>(give_back([&] { return runtime_.hipFree(device_pointer(b)); }));
      },
      call);
}

void HipDevice::deallocate(uint64_t address) {
  DeviceGuard guard(runtime_, ordinal_);
  allocations_.free(address, [this](uint64_t base) {
    runtime_.check(runtime_.hipFree(device_pointer(base)), CallKind::work,
                   "hipFree(ptr = 0x%llx) on device %d", static_cast<ull>(base), ordinal_);
  });
}

void HipDevice::copy_during_call(uint64_t dst, const void* src, uint64_t nbytes) {
  allocations_.require_range(dst, nbytes, "destination");
  DeviceGuard guard(runtime_, ordinal_);
  // From pageable memory HIP copies before returning, from pinned memory
  // later: waiting for the stream makes both "read when this returns".
  runtime_.check(static_cast<hipError_t>(
                     releases_.submit([&] { return enqueue_copy(dst, src, nbytes); })),
                 CallKind::work,
                 "hipMemcpyHtoDAsync(dst = 0x%llx, src = %p, sizeBytes = %llu, stream = device "
                 "%d's stream)",
                 static_cast<ull>(dst), src, static_cast<ull>(nbytes), ordinal_);
  runtime_.check(static_cast<hipError_t>(releases_.wait_until_over()), CallKind::work,
                 "hipStreamSynchronize(stream = device %d's stream) after a copy of %llu bytes",
                 ordinal_, static_cast<ull>(nbytes));
}

void HipDevice::copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                                    plugin::Release release) {
  allocations_.require_range(dst, nbytes, "destination");
  DeviceGuard guard(runtime_, ordinal_);
  const auto submitted = releases_.copy_until_released(dst, src, nbytes, std::move(release));
  runtime_.check(static_cast<hipError_t>(submitted.waited), CallKind::work,
                 "hipStreamSynchronize(stream = device %d's stream) before queuing more than %llu "
                 "stream callbacks",
                 ordinal_, static_cast<ull>(kCallbacksPerWait));
  runtime_.check(static_cast<hipError_t>(submitted.copied), CallKind::work,
                 "hipMemcpyHtoDAsync(dst = 0x%llx, src = %p, sizeBytes = %llu, stream = device "
                 "%d's stream)",
                 static_cast<ull>(dst), src, static_cast<ull>(nbytes), ordinal_);
  runtime_.check(static_cast<hipError_t>(submitted.released), CallKind::work,
                 "hipStreamAddCallback(stream = device %d's stream) after a copy of %llu bytes",
                 ordinal_, static_cast<ull>(nbytes));
}

void HipDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  allocations_.require_range(src, nbytes, "source");
  DeviceGuard guard(runtime_, ordinal_);
  runtime_.check(static_cast<hipError_t>(releases_.submit([&] {
                   return runtime_.hipMemcpyDtoHAsync(dst, device_pointer(src), nbytes, stream_);
                 })),
                 CallKind::work,
                 "hipMemcpyDtoHAsync(dst = %p, src = 0x%llx, sizeBytes = %llu, stream = device "
                 "%d's stream)",
                 dst, static_cast<ull>(src), static_cast<ull>(nbytes), ordinal_);
  runtime_.check(static_cast<hipError_t>(releases_.wait_until_over()), CallKind::work,
                 "hipStreamSynchronize(stream = device %d's stream) after a copy of %llu bytes",
                 ordinal_, static_cast<ull>(nbytes));
}

void HipDevice::synchronize() {
  DeviceGuard guard(runtime_, ordinal_);
  runtime_.check(static_cast<hipError_t>(releases_.wait_until_over()), CallKind::work,
                 "hipStreamSynchronize(stream = device %d's stream)", ordinal_);
}

void HipDevice::quiesce() noexcept {
  DeviceGuard guard(runtime_, ordinal_, std::nothrow);
  releases_.quiesce(guard.active());
}

int HipDevice::enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept {
  // hipMemcpyHtoDAsync takes a non-const source; it only reads it.
  return runtime_.hipMemcpyHtoDAsync(device_pointer(dst), const_cast<void*>(src), nbytes,
                                     stream_);
}

int HipDevice::enqueue_release(plugin::ReleaseQueue& releases) noexcept {
  return runtime_.hipStreamAddCallback(stream_, &HipDevice::release_oldest, &releases, 0);
}

int HipDevice::wait() noexcept { return runtime_.hipStreamSynchronize(stream_); }

HipDevice::State HipDevice::query() noexcept {
  switch (runtime_.hipStreamQuery(stream_)) {
    case hipSuccess:
      return State::idle;
    case hipErrorNotReady:
      return State::busy;
    default:
      return State::lost;
  }
}

void HipDevice::destroy() noexcept {
  static_cast<void>(give_back([&] { return runtime_.hipStreamDestroy(stream_); }));
}

// The status is ignored: ROCm passes hipSuccess to every callback, and a
// callback runs only once the copy before it is over, so that copy no
// longer reads its source. (A fault in device work ends the process in
// ROCr up to ROCm 6; see docs/plugins/hip.md.)
void HipDevice::release_oldest(hipStream_t, hipError_t, void* releases) {
  static_cast<plugin::ReleaseQueue*>(releases)->complete_oldest();
}

std::vector<std::unique_ptr<HipDevice>> open_devices(const Runtime& runtime) {
  int count = 0;
  runtime.check(runtime.hipGetDeviceCount(&count), CallKind::work, "hipGetDeviceCount");
  std::vector<std::unique_ptr<HipDevice>> devices;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    devices.push_back(std::make_unique<HipDevice>(runtime, ordinal));
  }
  return devices;
}

}  // namespace devalloc::hip
