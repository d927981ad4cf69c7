#include "cuda_device.hpp"

#include <cstdio>
#include <cstring>
#include <utility>

namespace devalloc::cuda {

namespace {

using ull = unsigned long long;

// The driver writes "domain:bus:device.function" in hex, its case and the
// width of the domain varying between versions; the ABI wants one form.
std::string normalize_pci_bus_id(const char* text) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  int consumed = 0;
  if (std::sscanf(text, "%x:%x:%x.%x%n", &domain, &bus, &device, &function,
                  &consumed) != 4 ||
      text[consumed] != '\0') {
    return {};
  }
  return format("%04x:%02x:%02x.%x", domain, bus, device, function);
}

}  // namespace

ContextScope::ContextScope(const Driver& driver, CUcontext context,
                           uint32_t ordinal)
    : driver_(driver) {
  driver.check(driver.cuCtxPushCurrent_v2(context),
               "device %u: cuCtxPushCurrent_v2(ctx = primary context)",
               ordinal);
}

ContextScope::~ContextScope() {
  CUcontext popped = nullptr;
  driver_.cuCtxPopCurrent_v2(&popped);
}

PendingRelease::PendingRelease(PendingRelease&& other) noexcept
    : on_release_(std::exchange(other.on_release_, nullptr)),
      user_data_(std::exchange(other.user_data_, nullptr)) {}

PendingRelease& PendingRelease::operator=(PendingRelease&& other) noexcept {
  if (this != &other) {
    fire();
    on_release_ = std::exchange(other.on_release_, nullptr);
    user_data_ = std::exchange(other.user_data_, nullptr);
  }
  return *this;
}

void PendingRelease::fire() noexcept {
  if (auto on_release = std::exchange(on_release_, nullptr)) {
    on_release(user_data_);
  }
}

CudaDevice::CudaDevice(const Driver& driver, uint32_t ordinal)
    : driver_(driver), ordinal_(ordinal) {
  const int index = static_cast<int>(ordinal);
  driver.check(driver.cuDeviceGet(&device_, index), "cuDeviceGet(ordinal = %d)",
               index);

  char name[DEVALLOC_DEVICE_NAME_CAPACITY] = {};
  driver.check(
      driver.cuDeviceGetName(name, static_cast<int>(sizeof name), device_),
      "device %u: cuDeviceGetName(len = %zu)", ordinal, sizeof name);
  name[sizeof name - 1] = '\0';
  properties_.name = name;

  size_t total = 0;
  driver.check(driver.cuDeviceTotalMem_v2(&total, device_),
               "device %u: cuDeviceTotalMem_v2", ordinal);
  properties_.total_memory_bytes = total;

  CUuuid uuid = {};
  driver.check(driver.cuDeviceGetUuid_v2(&uuid, device_),
               "device %u: cuDeviceGetUuid_v2", ordinal);
  std::memcpy(properties_.uuid.data(), uuid.bytes, properties_.uuid.size());

  // 13 characters are documented as enough; leave room for wider domains.
  char pci[DEVALLOC_PCI_BUS_ID_CAPACITY] = {};
  driver.check(
      driver.cuDeviceGetPCIBusId(pci, static_cast<int>(sizeof pci), device_),
      "device %u: cuDeviceGetPCIBusId(len = %zu)", ordinal, sizeof pci);
  pci[sizeof pci - 1] = '\0';
  properties_.pci_bus_id = normalize_pci_bus_id(pci);

  driver.check(driver.cuDevicePrimaryCtxRetain(&context_, device_),
               "device %u: cuDevicePrimaryCtxRetain", ordinal);
  try {
    ContextScope scope(driver, context_, ordinal);
    driver.check(driver.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING),
                 "device %u: cuStreamCreate(Flags = CU_STREAM_NON_BLOCKING)",
                 ordinal);
  } catch (...) {
    driver.cuDevicePrimaryCtxRelease_v2(device_);
    throw;
  }
}

CudaDevice::~CudaDevice() {
  drain();
  try {
    ContextScope scope(driver_, context_, ordinal_);
    for (const auto& [address, nbytes] : allocations_.all()) {
      const auto base = bases_.find(address);
      driver_.cuMemFree_v2(base == bases_.end() ? address : base->second);
    }
    driver_.cuStreamDestroy_v2(stream_);
  } catch (const plugin::Failure&) {
    // Without the context nothing can be freed; releasing it below lets
    // the driver reclaim all of it.
  }
  driver_.cuDevicePrimaryCtxRelease_v2(device_);
}

uint64_t CudaDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  const uint64_t slack =
      alignment > kNaturalAlignment ? alignment - kNaturalAlignment : 0;
  if (nbytes > UINT64_MAX - slack) {
    throw plugin::Failure{
        DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
        format("device %u: %llu bytes aligned to %llu exceed any device's "
               "address space",
               ordinal_, static_cast<ull>(nbytes),
               static_cast<ull>(alignment))};
  }
  ContextScope scope(driver_, context_, ordinal_);
  CUdeviceptr base = 0;
  driver_.check_allocation(driver_.cuMemAlloc_v2(&base, nbytes + slack),
                           "device %u: cuMemAlloc_v2(bytesize = %llu)",
                           ordinal_, static_cast<ull>(nbytes + slack));
  const uint64_t address = (base + alignment - 1) & ~(alignment - 1);
  if (address != base) {
    std::lock_guard lock(bases_mutex_);
    bases_.emplace(address, base);
  }
  allocations_.insert(address, nbytes);
  return address;
}

void CudaDevice::deallocate(uint64_t address) {
  if (!allocations_.erase(address, nullptr)) {
    throw plugin::Failure{
        DEVALLOC_STATUS_INVALID_ARGUMENT,
        format("device %u: 0x%llx is not the address of a live allocation "
               "of this device",
               ordinal_, static_cast<ull>(address))};
  }
  uint64_t base = address;
  {
    std::lock_guard lock(bases_mutex_);
    if (auto it = bases_.find(address); it != bases_.end()) {
      base = it->second;
      bases_.erase(it);
    }
  }
  ContextScope scope(driver_, context_, ordinal_);
  driver_.check(driver_.cuMemFree_v2(base),
                "device %u: cuMemFree_v2(dptr = 0x%llx)", ordinal_,
                static_cast<ull>(base));
}

void CudaDevice::copy_during_call(uint64_t dst, const void* src,
                                  uint64_t nbytes) {
  check_range(dst, nbytes, "destination");
  ContextScope scope(driver_, context_, ordinal_);
  // Not cuMemcpyHtoD_v2: it runs on the legacy default stream, which a
  // non-blocking stream does not order against, and from pageable memory it
  // may return before the bytes have landed; synchronize() would then not
  // cover it. Queued on the device's stream and waited for, the copy has
  // read src, pageable or pinned, when the stream is idle.
  driver_.check(driver_.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream_),
                "device %u: cuMemcpyHtoDAsync_v2(dstDevice = 0x%llx, srcHost = "
                "%p, ByteCount = %llu, hStream = device stream)",
                ordinal_, static_cast<ull>(dst), src, static_cast<ull>(nbytes));
  driver_.check(wait_for_stream(),
                "device %u: cuStreamSynchronize(hStream = device stream) after "
                "a copy of %llu bytes to 0x%llx",
                ordinal_, static_cast<ull>(nbytes), static_cast<ull>(dst));
}

void CudaDevice::copy_until_released(uint64_t dst, const void* src,
                                     uint64_t nbytes, PendingRelease release) {
  check_range(dst, nbytes, "destination");
  ContextScope scope(driver_, context_, ordinal_);
  std::lock_guard submit(submit_mutex_);
  // Queued before the copy, so that nothing is in flight that the release
  // could not follow.
  {
    std::lock_guard lock(pending_mutex_);
    pending_.push_back(std::move(release));
  }
  const CUresult copied =
      driver_.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream_);
  const CUresult launched =
      copied == CUDA_SUCCESS
          ? driver_.cuLaunchHostFunc(stream_, &CudaDevice::release_oldest, this)
          : CUDA_SUCCESS;
  if (copied == CUDA_SUCCESS && launched == CUDA_SUCCESS) return;

  // No host function will release this source. Take the release back: the
  // newest entry, as other submitters are held off, or absent if a failed
  // context fired every entry already. If the copy was queued, wait until
  // it is over, successful or not, before firing.
  PendingRelease mine;
  {
    std::lock_guard lock(pending_mutex_);
    if (!pending_.empty()) {
      mine = std::move(pending_.back());
      pending_.pop_back();
    }
  }
  if (copied == CUDA_SUCCESS) wait_for_stream();
  mine.fire();
  driver_.check(copied,
                "device %u: cuMemcpyHtoDAsync_v2(dstDevice = 0x%llx, srcHost = "
                "%p, ByteCount = %llu, hStream = device stream)",
                ordinal_, static_cast<ull>(dst), src, static_cast<ull>(nbytes));
  driver_.check(launched,
                "device %u: cuLaunchHostFunc(hStream = device stream) after a "
                "copy of %llu bytes to 0x%llx",
                ordinal_, static_cast<ull>(nbytes), static_cast<ull>(dst));
}

void CudaDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  check_range(src, nbytes, "source");
  ContextScope scope(driver_, context_, ordinal_);
  // On the device's stream, so that it reads after every earlier copy.
  driver_.check(driver_.cuMemcpyDtoHAsync_v2(dst, src, nbytes, stream_),
                "device %u: cuMemcpyDtoHAsync_v2(dstHost = %p, srcDevice = "
                "0x%llx, ByteCount = %llu, hStream = device stream)",
                ordinal_, dst, static_cast<ull>(src), static_cast<ull>(nbytes));
  driver_.check(wait_for_stream(),
                "device %u: cuStreamSynchronize(hStream = device stream) after "
                "a copy of %llu bytes from 0x%llx",
                ordinal_, static_cast<ull>(nbytes), static_cast<ull>(src));
}

void CudaDevice::synchronize() {
  ContextScope scope(driver_, context_, ordinal_);
  driver_.check(wait_for_stream(),
                "device %u: cuStreamSynchronize(hStream = device stream)",
                ordinal_);
}

void CudaDevice::drain() noexcept {
  try {
    ContextScope scope(driver_, context_, ordinal_);
    wait_for_stream();
  } catch (const plugin::Failure&) {
    // The context cannot be made current, so no host function will run.
  }
  fire_all_pending();
}

void CudaDevice::release_oldest(void* device) {
  auto* self = static_cast<CudaDevice*>(device);
  PendingRelease release;
  {
    std::lock_guard lock(self->pending_mutex_);
    if (self->pending_.empty()) return;
    release = std::move(self->pending_.front());
    self->pending_.pop_front();
  }
  release.fire();
}

void CudaDevice::check_range(uint64_t address, uint64_t nbytes,
                             const char* role) const {
  if (!allocations_.contains(address, nbytes)) {
    throw plugin::Failure{
        DEVALLOC_STATUS_INVALID_ARGUMENT,
        format("device %u: %s [0x%llx, +%llu) is not inside a live "
               "allocation of this device",
               ordinal_, role, static_cast<ull>(address),
               static_cast<ull>(nbytes))};
  }
}

CUresult CudaDevice::wait_for_stream() {
  const CUresult result = driver_.cuStreamSynchronize(stream_);
  if (result != CUDA_SUCCESS) fire_all_pending();
  return result;
}

void CudaDevice::fire_all_pending() {
  std::deque<PendingRelease> owed;
  {
    std::lock_guard lock(pending_mutex_);
    owed.swap(pending_);
  }
  for (auto& release : owed) release.fire();
}

std::vector<std::unique_ptr<CudaDevice>> open_devices(const Driver& driver) {
  std::vector<std::unique_ptr<CudaDevice>> devices;
  const CUresult initialized = driver.cuInit(0);
  if (initialized == CUDA_ERROR_NO_DEVICE) return devices;
  driver.check(initialized, "cuInit(Flags = 0)");
  int count = 0;
  const CUresult counted = driver.cuDeviceGetCount(&count);
  if (counted == CUDA_ERROR_NO_DEVICE) return devices;
  driver.check(counted, "cuDeviceGetCount");
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    devices.push_back(
        std::make_unique<CudaDevice>(driver, static_cast<uint32_t>(ordinal)));
  }
  return devices;
}

PinnedHostMemory::~PinnedHostMemory() {
  if (live_.empty()) return;
  try {
    ContextScope scope(driver_, owner_.context(), owner_.ordinal());
    for (const auto& [host, nbytes] : live_) driver_.cuMemFreeHost(host);
  } catch (const plugin::Failure&) {
    // Releasing the primary context reclaims it.
  }
}

void* PinnedHostMemory::allocate(uint64_t nbytes) {
  ContextScope scope(driver_, owner_.context(), owner_.ordinal());
  void* host = nullptr;
  // Portable: the memory is pinned for every context, not only the first
  // device's, so that copies to any device run from it at full speed.
  driver_.check_host_allocation(
      driver_.cuMemHostAlloc(&host, nbytes, CU_MEMHOSTALLOC_PORTABLE),
      "cuMemHostAlloc(bytesize = %llu, Flags = CU_MEMHOSTALLOC_PORTABLE)",
      static_cast<ull>(nbytes));
  std::lock_guard lock(mutex_);
  live_.emplace(host, nbytes);
  return host;
}

void PinnedHostMemory::free(void* host) {
  {
    std::lock_guard lock(mutex_);
    if (live_.erase(host) == 0) {
      throw plugin::Failure{
          DEVALLOC_STATUS_INVALID_ARGUMENT,
          format("%p was not returned by allocate_host or is already freed",
                 host)};
    }
  }
  ContextScope scope(driver_, owner_.context(), owner_.ordinal());
  driver_.check(driver_.cuMemFreeHost(host), "cuMemFreeHost(p = %p)", host);
}

}  // namespace devalloc::cuda
