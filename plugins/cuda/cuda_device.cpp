#include "cuda_device.hpp"

#include <devalloc/plugin_kit/abi_glue.hpp>
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/give_back.hpp>

#include <cstring>

namespace devalloc::cuda {

namespace {

using plugin::CallKind;
using plugin::give_back;
using plugin::RuntimeCall;
using ull = unsigned long long;

}  // namespace

// A pop that failed once would leave the plugin's context current on the
// caller's thread, under the caller's own: retried.
void PopContext::operator()() const noexcept {
  CUcontext popped = nullptr;
  give_back([&] { return driver->cuCtxPopCurrent_v2(&popped); });
}

CudaStream::CudaStream(plugin::DeviceDescription& description, const Driver& driver,
                       uint32_t ordinal)
    : driver_(driver), ordinal_(ordinal) {
  const int index = static_cast<int>(ordinal);
  driver.check(driver.cuDeviceGet(&device_, index), CallKind::work, "cuDeviceGet(ordinal = %d)",
               index);

  description.name =
      plugin::read_text<DEVALLOC_DEVICE_NAME_CAPACITY>([&](char* name, int len) {
        driver.check(driver.cuDeviceGetName(name, len, device_), CallKind::work,
                     "device %u: cuDeviceGetName(len = %d)", ordinal, len);
      });

  size_t total = 0;
  driver.check(driver.cuDeviceTotalMem_v2(&total, device_), CallKind::work,
               "device %u: cuDeviceTotalMem_v2", ordinal);
  description.total_memory_bytes = total;

  CUuuid uuid = {};
  driver.check(driver.cuDeviceGetUuid_v2(&uuid, device_), CallKind::work,
               "device %u: cuDeviceGetUuid_v2", ordinal);
  std::memcpy(description.uuid.data(), uuid.bytes, description.uuid.size());

  // 13 characters are documented as enough; leave room for wider domains.
  description.pci_bus_id = plugin::normalize_pci_bus_id(
      plugin::read_text<DEVALLOC_PCI_BUS_ID_CAPACITY>([&](char* pci, int len) {
        driver.check(driver.cuDeviceGetPCIBusId(pci, len, device_), CallKind::work,
                     "device %u: cuDeviceGetPCIBusId(len = %d)", ordinal, len);
      }).c_str());
  description.dlpack_device_type = DEVALLOC_DLPACK_CUDA;
  description.dlpack_device_id = index;

  driver.check(driver.cuDevicePrimaryCtxRetain(&context_, device_), CallKind::work,
               "device %u: cuDevicePrimaryCtxRetain", ordinal);
  try {
    const auto scope = enter();
    driver.check(driver.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CallKind::work,
                 "device %u: cuStreamCreate(Flags = CU_STREAM_NON_BLOCKING)", ordinal);
  } catch (...) {
    give_back([&] { return driver.cuDevicePrimaryCtxRelease_v2(device_); });
    throw;
  }
}

ContextScope CudaStream::enter() const {
  driver_.check(driver_.cuCtxPushCurrent_v2(context_), CallKind::work,
                "device %u: cuCtxPushCurrent_v2(ctx = primary context)", ordinal_);
  return ContextScope(PopContext{&driver_});
}

ContextScope CudaStream::enter(std::nothrow_t) const noexcept {
  if (give_back([&] { return driver_.cuCtxPushCurrent_v2(context_); }) != CUDA_SUCCESS) return {};
  return ContextScope(PopContext{&driver_});
}

const Driver& CudaStream::runtime() const { return driver_; }

CudaStream::~CudaStream() {
  give_back([&] { return driver_.cuDevicePrimaryCtxRelease_v2(device_); });
}

std::string CudaStream::call_text(RuntimeCall call, const plugin::CallArguments& args) const {
  const auto device = static_cast<ull>(args.device);
  const auto nbytes = static_cast<ull>(args.nbytes);
  std::string text;
  switch (call) {
    // Portable host memory belongs to no device.
    case RuntimeCall::allocate_host:
      return plugin::format("cuMemHostAlloc(bytesize = %llu, Flags = CU_MEMHOSTALLOC_PORTABLE)",
                            nbytes);
    case RuntimeCall::free_host:
      return plugin::format("cuMemFreeHost(p = %p)", args.host);
    case RuntimeCall::memory_info:
      text = "cuMemGetInfo_v2";
      break;
    case RuntimeCall::allocate:
      text = plugin::format("cuMemAlloc_v2(bytesize = %llu)", nbytes);
      break;
    case RuntimeCall::free:
      text = plugin::format("cuMemFree_v2(dptr = 0x%llx)", device);
      break;
    case RuntimeCall::copy_to_device:
      text = plugin::format(
          "cuMemcpyHtoDAsync_v2(dstDevice = 0x%llx, srcHost = %p, ByteCount = %llu, hStream = "
          "device stream)",
          device, args.host, nbytes);
      break;
    case RuntimeCall::release:
      text = plugin::format(
          "cuLaunchHostFunc(hStream = device stream) after a copy of %llu bytes to 0x%llx", nbytes,
          device);
      break;
    case RuntimeCall::wait_for_copy_to_device:
    case RuntimeCall::wait_for_copy_to_host:
      text = plugin::format(
          "cuStreamSynchronize(hStream = device stream) after a copy of %llu bytes %s 0x%llx",
          nbytes, call == RuntimeCall::wait_for_copy_to_host ? "from" : "to", device);
      break;
    case RuntimeCall::copy_to_host:
      text = plugin::format(
          "cuMemcpyDtoHAsync_v2(dstHost = %p, srcDevice = 0x%llx, ByteCount = %llu, hStream = "
          "device stream)",
          args.host, device, nbytes);
      break;
    case RuntimeCall::bounded_wait:  // never made: kCallbacksPerWait is 0
    case RuntimeCall::synchronize:
      text = "cuStreamSynchronize(hStream = device stream)";
      break;
  }
  return plugin::format("device %u: ", ordinal_) + text;
}

int CudaStream::memory_info(size_t& free_bytes, size_t& total_bytes) const noexcept {
  return driver_.cuMemGetInfo_v2(&free_bytes, &total_bytes);
}

int CudaStream::allocate(uint64_t nbytes, uint64_t& base) noexcept {
  CUdeviceptr pointer = 0;
  const CUresult result = driver_.cuMemAlloc_v2(&pointer, nbytes);
  base = pointer;
  return result;
}

int CudaStream::free(uint64_t base) noexcept { return driver_.cuMemFree_v2(base); }

int CudaStream::enqueue_copy_to_host(void* dst, uint64_t src, uint64_t nbytes) noexcept {
  return driver_.cuMemcpyDtoHAsync_v2(dst, src, nbytes, stream_);
}

int CudaStream::allocate_host(uint64_t nbytes, void*& host) const noexcept {
  return driver_.cuMemHostAlloc(&host, nbytes, CU_MEMHOSTALLOC_PORTABLE);
}

int CudaStream::free_host(void* host) const noexcept { return driver_.cuMemFreeHost(host); }

// Not cuMemcpyHtoD_v2 for copies during the call: it runs on the legacy
// default stream, which a non-blocking stream does not order against.
int CudaStream::enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept {
  return driver_.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream_);
}

int CudaStream::enqueue_release(plugin::ReleaseQueue& releases) noexcept {
  return driver_.cuLaunchHostFunc(stream_, &CudaStream::release_oldest, &releases);
}

int CudaStream::wait() noexcept { return driver_.cuStreamSynchronize(stream_); }

// A context with a sticky error reports it for every call; host functions
// never run in it again.
CudaStream::State CudaStream::query() noexcept {
  return plugin::stream_state(driver_.cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);
}

void CudaStream::destroy() noexcept {
  give_back([&] { return driver_.cuStreamDestroy_v2(stream_); });
}

void CudaStream::release_oldest(void* releases) {
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

}  // namespace devalloc::cuda
