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
using plugin::RuntimeCall;
using ull = unsigned long long;

// One text for every call: the stream's and the host memory's (no device).
std::string hip_call_text(RuntimeCall call, int ordinal, const plugin::CallArguments& args) {
  const auto device = static_cast<ull>(args.device);
  const auto nbytes = static_cast<ull>(args.nbytes);
  const std::string stream = plugin::format("stream = device %d's stream", ordinal);
  const std::string after_copy = plugin::format("after a copy of %llu bytes", nbytes);
  switch (call) {
    case RuntimeCall::memory_info:
      return plugin::format("hipMemGetInfo on device %d", ordinal);
    case RuntimeCall::allocate:
      return plugin::format("hipMalloc(size = %llu) on device %d", nbytes, ordinal);
    case RuntimeCall::free:
      return plugin::format("hipFree(ptr = 0x%llx) on device %d", device, ordinal);
    case RuntimeCall::copy_to_device:
      return plugin::format("hipMemcpyHtoDAsync(dst = 0x%llx, src = %p, sizeBytes = %llu, %s)",
                            device, args.host, nbytes, stream.c_str());
    case RuntimeCall::copy_to_host:
      return plugin::format("hipMemcpyDtoHAsync(dst = %p, src = 0x%llx, sizeBytes = %llu, %s)",
                            args.host, device, nbytes, stream.c_str());
    case RuntimeCall::bounded_wait:
      return plugin::format(
          "hipStreamSynchronize(%s) before queuing more than %llu stream callbacks",
          stream.c_str(), static_cast<ull>(HipStream::kCallbacksPerWait));
    case RuntimeCall::release:
      return "hipStreamAddCallback(" + stream + ") " + after_copy;
    case RuntimeCall::wait_for_copy_to_device:
    case RuntimeCall::wait_for_copy_to_host:
      return "hipStreamSynchronize(" + stream + ") " + after_copy;
    case RuntimeCall::synchronize:
      return "hipStreamSynchronize(" + stream + ")";
    case RuntimeCall::allocate_host:
      return plugin::format("hipHostMalloc(size = %llu, flags = hipHostMallocPortable)", nbytes);
    case RuntimeCall::free_host:
      return plugin::format("hipHostFree(ptr = %p)", args.host);
  }
  return {};
}

void* device_pointer(uint64_t address) { return reinterpret_cast<void*>(address); }
uint64_t device_address(void* p) { return reinterpret_cast<uint64_t>(p); }

}  // namespace

// A restore that failed once would leave the caller's thread on this
// device: retried.
void RestoreDevice::operator()() const noexcept {
  static_cast<void>(give_back([&] { return runtime->hipSetDevice(previous); }));
}

HipStream::HipStream(plugin::DeviceDescription& description, const Runtime& runtime, int ordinal)
    : runtime_(runtime), ordinal_(ordinal) {
  description.name =
      plugin::read_text<DEVALLOC_DEVICE_NAME_CAPACITY>([&](char* name, int len) {
        runtime.check(runtime.hipDeviceGetName(name, len, ordinal), CallKind::work,
                      "hipDeviceGetName(len = %d, device = %d)", len, ordinal);
      });

  size_t total = 0;
  runtime.check(runtime.hipDeviceTotalMem(&total, ordinal), CallKind::work,
                "hipDeviceTotalMem(device = %d)", ordinal);
  description.total_memory_bytes = total;

  hipUUID uuid = {};
  runtime.check(runtime.hipDeviceGetUuid(&uuid, ordinal), CallKind::work,
                "hipDeviceGetUuid(device = %d)", ordinal);
  std::memcpy(description.uuid.data(), uuid.bytes, description.uuid.size());

  description.pci_bus_id = plugin::normalize_pci_bus_id(
      plugin::read_text<DEVALLOC_PCI_BUS_ID_CAPACITY>([&](char* pci, int len) {
        runtime.check(runtime.hipDeviceGetPCIBusId(pci, len, ordinal), CallKind::work,
                      "hipDeviceGetPCIBusId(len = %d, device = %d)", len, ordinal);
      }).c_str());
  description.dlpack_device_type = DEVALLOC_DLPACK_ROCM;
  description.dlpack_device_id = ordinal;

  const auto scope = enter();
  runtime.check(runtime.hipStreamCreateWithFlags(&stream_, hipStreamNonBlocking), CallKind::work,
                "hipStreamCreateWithFlags(flags = hipStreamNonBlocking) on device %d", ordinal);
}

DeviceScope HipStream::enter() const {
  int previous = -1;
  runtime_.check(runtime_.hipGetDevice(&previous), CallKind::work, "hipGetDevice");
  runtime_.check(runtime_.hipSetDevice(ordinal_), CallKind::work, "hipSetDevice(deviceId = %d)",
                 ordinal_);
  return DeviceScope(RestoreDevice{&runtime_, previous});
}

DeviceScope HipStream::enter(std::nothrow_t) const noexcept {
  int previous = -1;
  if (give_back([&] { return runtime_.hipGetDevice(&previous); }) != hipSuccess ||
      give_back([&] { return runtime_.hipSetDevice(ordinal_); }) != hipSuccess) {
    return {};
  }
  return DeviceScope(RestoreDevice{&runtime_, previous});
}

const Runtime& HipStream::runtime() const { return runtime_; }

std::string HipStream::call_text(RuntimeCall call, const plugin::CallArguments& args) const {
  return hip_call_text(call, ordinal_, args);
}

int HipStream::memory_info(size_t& free_bytes, size_t& total_bytes) const noexcept {
  return runtime_.hipMemGetInfo(&free_bytes, &total_bytes);
}

int HipStream::allocate(uint64_t nbytes, uint64_t& base) noexcept {
  void* pointer = nullptr;
  const hipError_t result = runtime_.hipMalloc(&pointer, nbytes);
  base = device_address(pointer);
  return result;
}

int HipStream::free(uint64_t base) noexcept { return runtime_.hipFree(device_pointer(base)); }

int HipStream::enqueue_copy_to_host(void* dst, uint64_t src, uint64_t nbytes) noexcept {
  return runtime_.hipMemcpyDtoHAsync(dst, device_pointer(src), nbytes, stream_);
}

// From pageable memory HIP copies before returning, from pinned memory
// later: StreamDevice waits for the stream after a copy during the call.
int HipStream::enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept {
  // hipMemcpyHtoDAsync takes a non-const source; it only reads it.
  return runtime_.hipMemcpyHtoDAsync(device_pointer(dst), const_cast<void*>(src), nbytes, stream_);
}

int HipStream::enqueue_release(plugin::ReleaseQueue& releases) noexcept {
  return runtime_.hipStreamAddCallback(stream_, &HipStream::release_oldest, &releases, 0);
}

int HipStream::wait() noexcept { return runtime_.hipStreamSynchronize(stream_); }

HipStream::State HipStream::query() noexcept {
  return plugin::stream_state(runtime_.hipStreamQuery(stream_), hipErrorNotReady);
}

void HipStream::destroy() noexcept {
  static_cast<void>(give_back([&] { return runtime_.hipStreamDestroy(stream_); }));
}

// The status is ignored: ROCm passes hipSuccess to every callback, and a
// callback runs only once the copy before it is over, so that copy no
// longer reads its source. (A fault in device work ends the process in
// ROCr up to ROCm 6; see docs/plugins/hip.md.)
void HipStream::release_oldest(hipStream_t, hipError_t, void* releases) {
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

std::string HipHostMemory::call_text(RuntimeCall call, const plugin::CallArguments& args) const {
  return hip_call_text(call, -1, args);
}

int HipHostMemory::allocate_host(uint64_t nbytes, void*& host) const noexcept {
  return runtime_.hipHostMalloc(&host, nbytes, hipHostMallocPortable);
}

int HipHostMemory::free_host(void* host) const noexcept { return runtime_.hipHostFree(host); }

}  // namespace devalloc::hip
