// The ABI glue of the CUDA plugin: argument checks, the exception barrier
// and the function table. CUDA itself is reached through cuda_device.hpp.
#include "cuda_device.hpp"

#include <plugin_support.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifndef DEVALLOC_CUDA_PLUGIN_VERSION
#error "DEVALLOC_CUDA_PLUGIN_VERSION must be defined by the build"
#endif

using devalloc::cuda::CudaDevice;
using devalloc::cuda::PendingRelease;
using devalloc::plugin::Failure;
using devalloc::plugin::guard;
using devalloc::plugin::has_size;

struct devalloc_instance {
  explicit devalloc_instance(const std::string& runtime_library);
  ~devalloc_instance();

  CudaDevice& device(uint32_t index) const;

  devalloc::cuda::Driver driver;
  std::vector<std::unique_ptr<CudaDevice>> devices;
  std::unique_ptr<devalloc::cuda::PinnedHostMemory> pinned;
};

devalloc_instance::devalloc_instance(const std::string& runtime_library)
    : driver(runtime_library), devices(devalloc::cuda::open_devices(driver)) {
  if (!devices.empty()) {
    pinned = std::make_unique<devalloc::cuda::PinnedHostMemory>(
        driver, *devices.front());
  }
}

devalloc_instance::~devalloc_instance() {
  // Pinned memory may be the source of copies still in flight on any
  // device, so every device is drained before it is freed.
  for (auto& device : devices) device->drain();
  pinned.reset();
  devices.clear();
}

CudaDevice& devalloc_instance::device(uint32_t index) const {
  if (index >= devices.size()) {
    throw Failure{DEVALLOC_STATUS_NO_SUCH_DEVICE,
                  devalloc::cuda::format(
                      "device %u does not exist (this instance has %zu CUDA "
                      "device%s)",
                      index, devices.size(), devices.size() == 1 ? "" : "s")};
  }
  return *devices[index];
}

namespace {

void require(bool condition, const char* message) {
  if (!condition) throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, message};
}

void copy_text(char* dst, size_t capacity, const std::string& text) {
  const size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

devalloc_status create(devalloc_create_args* args, devalloc_error* error) {
  return guard(error, [&] {
    require(has_size(args, args ? args->struct_size : 0,
                     DEVALLOC_STRUCT_SIZE(devalloc_create_args, instance)),
            "create: args is NULL or older than ABI 1.0");
    devalloc::plugin::Options options(*args);
    std::string library = "libcuda.so.1";
    options.take("runtime_library", library);
    options.reject_unknown("cuda", "runtime_library");
    require(!library.empty(), "cuda: option runtime_library is empty");
    try {
      args->instance = new devalloc_instance(library);
    } catch (Failure& failure) {
      // Whatever failed, the driver could not be set up.
      failure.status = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE;
      failure.message.insert(0, "cuda: ");
      throw;
    }
    return DEVALLOC_STATUS_OK;
  });
}

void destroy(devalloc_instance* instance) { delete instance; }

devalloc_status get_capabilities(devalloc_instance* instance,
                                 devalloc_capabilities* capabilities,
                                 devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr, "get_capabilities: instance is NULL");
    require(
        has_size(capabilities, capabilities ? capabilities->struct_size : 0,
                 DEVALLOC_STRUCT_SIZE(devalloc_capabilities, max_alignment)),
        "get_capabilities: capabilities is NULL or older than ABI 1.0");
    capabilities->flags = DEVALLOC_CAPABILITY_ASYNC_COPY;
    if (instance->pinned)
      capabilities->flags |= DEVALLOC_CAPABILITY_HOST_STAGING;
    capabilities->max_alignment = CudaDevice::kMaxAlignment;
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status get_device_count(devalloc_instance* instance, uint32_t* count,
                                 devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr && count != nullptr,
            "get_device_count: instance or count is NULL");
    *count = static_cast<uint32_t>(instance->devices.size());
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status get_device_properties(devalloc_instance* instance,
                                      uint32_t device,
                                      devalloc_device_properties* properties,
                                      devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr, "get_device_properties: instance is NULL");
    require(has_size(properties, properties ? properties->struct_size : 0,
                     DEVALLOC_STRUCT_SIZE(devalloc_device_properties,
                                          dlpack_device_id)),
            "get_device_properties: properties is NULL or older than ABI 1.0");
    const auto& p = instance->device(device).properties();
    copy_text(properties->name, sizeof properties->name, p.name);
    properties->total_memory_bytes = p.total_memory_bytes;
    std::memcpy(properties->uuid, p.uuid.data(), sizeof properties->uuid);
    copy_text(properties->pci_bus_id, sizeof properties->pci_bus_id,
              p.pci_bus_id);
    properties->dlpack_device_type = DEVALLOC_DLPACK_CUDA;
    properties->dlpack_device_id = static_cast<int32_t>(device);
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status allocate(devalloc_instance* instance,
                         devalloc_allocate_args* args, devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr, "allocate: instance is NULL");
    require(has_size(args, args ? args->struct_size : 0,
                     DEVALLOC_STRUCT_SIZE(devalloc_allocate_args, address)),
            "allocate: args is NULL or older than ABI 1.0");
    require(args->reserved0 == 0, "allocate: reserved0 is not 0");
    CudaDevice& device = instance->device(args->device);
    const uint64_t alignment =
        args->alignment == 0 ? CudaDevice::kNaturalAlignment : args->alignment;
    if (!devalloc::plugin::is_power_of_two(alignment)) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    devalloc::cuda::format(
                        "allocate: alignment %llu is not a power of two",
                        static_cast<unsigned long long>(alignment))};
    }
    if (alignment > CudaDevice::kMaxAlignment) {
      throw Failure{
          DEVALLOC_STATUS_UNSUPPORTED,
          devalloc::cuda::format(
              "allocate: alignment %llu is above the largest this "
              "plugin honours (%llu)",
              static_cast<unsigned long long>(alignment),
              static_cast<unsigned long long>(CudaDevice::kMaxAlignment))};
    }
    args->address =
        args->nbytes == 0 ? 0 : device.allocate(args->nbytes, alignment);
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status deallocate(devalloc_instance* instance, uint32_t device,
                           devalloc_device_address address,
                           devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr, "deallocate: instance is NULL");
    CudaDevice& target = instance->device(device);
    if (address != 0) target.deallocate(address);
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status copy_host_to_device(devalloc_instance* instance,
                                    const devalloc_copy_to_device_args* args,
                                    devalloc_error* error) {
  if (!has_size(
          args, args ? args->struct_size : 0,
          DEVALLOC_STRUCT_SIZE(devalloc_copy_to_device_args, user_data))) {
    return devalloc::plugin::fail(
        error, DEVALLOC_STATUS_INVALID_ARGUMENT,
        "copy_host_to_device: args is NULL or older than ABI 1.0");
  }
  // Owed from here on, whatever fails below.
  PendingRelease release;
  if (args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED) {
    release = PendingRelease(args->on_release, args->user_data);
  }
  return guard(error, [&] {
    require(instance != nullptr, "copy_host_to_device: instance is NULL");
    require(args->src_lifetime == DEVALLOC_SRC_DURING_CALL ||
                args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED,
            "copy_host_to_device: unknown src_lifetime");
    CudaDevice& device = instance->device(args->device);
    if (args->nbytes == 0) return DEVALLOC_STATUS_OK;
    require(args->src != nullptr, "copy_host_to_device: src is NULL");
    if (args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED) {
      device.copy_until_released(args->dst, args->src, args->nbytes,
                                 std::move(release));
    } else {
      device.copy_during_call(args->dst, args->src, args->nbytes);
    }
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status copy_device_to_host(devalloc_instance* instance,
                                    const devalloc_copy_to_host_args* args,
                                    devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr, "copy_device_to_host: instance is NULL");
    require(has_size(args, args ? args->struct_size : 0,
                     DEVALLOC_STRUCT_SIZE(devalloc_copy_to_host_args, nbytes)),
            "copy_device_to_host: args is NULL or older than ABI 1.0");
    require(args->reserved0 == 0, "copy_device_to_host: reserved0 is not 0");
    CudaDevice& device = instance->device(args->device);
    if (args->nbytes == 0) return DEVALLOC_STATUS_OK;
    require(args->dst != nullptr, "copy_device_to_host: dst is NULL");
    device.copy_to_host(args->dst, args->src, args->nbytes);
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status synchronize(devalloc_instance* instance, uint32_t device,
                            devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr, "synchronize: instance is NULL");
    instance->device(device).synchronize();
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status allocate_host(devalloc_instance* instance, uint64_t nbytes,
                              void** host, devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr && host != nullptr,
            "allocate_host: instance or host is NULL");
    *host = nullptr;
    if (nbytes == 0) return DEVALLOC_STATUS_OK;
    if (!instance->pinned) {
      throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                    "allocate_host: pinned memory needs a CUDA context, and "
                    "this instance has no CUDA device"};
    }
    *host = instance->pinned->allocate(nbytes);
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status free_host(devalloc_instance* instance, void* host,
                          devalloc_error* error) {
  return guard(error, [&] {
    require(instance != nullptr, "free_host: instance is NULL");
    if (host == nullptr) return DEVALLOC_STATUS_OK;
    require(instance->pinned != nullptr,
            "free_host: this instance has no CUDA device and allocated no "
            "pinned memory");
    instance->pinned->free(host);
    return DEVALLOC_STATUS_OK;
  });
}

const devalloc_plugin_api_v1 kApi = {
    sizeof(devalloc_plugin_api_v1),
    DEVALLOC_ABI_VERSION_MAJOR,
    DEVALLOC_ABI_VERSION_MINOR,
    "cuda",
    DEVALLOC_CUDA_PLUGIN_VERSION,
    create,
    destroy,
    get_capabilities,
    get_device_count,
    get_device_properties,
    allocate,
    deallocate,
    copy_host_to_device,
    copy_device_to_host,
    synchronize,
    allocate_host,
    free_host,
};

}  // namespace

extern "C" DEVALLOC_PLUGIN_EXPORT devalloc_status devalloc_plugin_negotiate(
    devalloc_negotiation* negotiation, devalloc_error* error) {
  return devalloc::plugin::negotiate_v1(negotiation, error, &kApi);
}
