// ABI glue of the host plugin: validates the structs that cross the
// boundary, names the call in every failure, and hands the work to
// HostDevice.
#include "host_device.hpp"
#include "host_variant.hpp"

#include <devalloc/plugin_abi.h>
#include <plugin_support.hpp>

#include <cinttypes>
#include <cstddef>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

struct devalloc_instance {
  devalloc_instance(bool async, const devalloc::host::FaultPlan::Settings& faults_settings)
      : faults(faults_settings), device(async) {}

  devalloc::host::FaultPlan faults;
  devalloc::host::HostDevice device;
};

namespace devalloc::host {
namespace {

using plugin::Failure;
using plugin::guard;

using plugin::format;

// Runs body and prefixes any failure with describe(): the call and its
// arguments, so that every message says which request it answers.
template <class Describe, class Body>
devalloc_status in_call(const Describe& describe, const Body& body) {
  try {
    body();
    return DEVALLOC_STATUS_OK;
  } catch (Failure& f) {
    f.message = describe() + ": " + f.message;
    throw;
  } catch (const std::bad_alloc&) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, describe() + ": out of host memory"};
  }
}

devalloc_instance& checked(devalloc_instance* instance, const char* call) {
  if (instance == nullptr) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, std::string(call) + ": instance is NULL"};
  }
  return *instance;
}

template <class Args>
void check_args(const Args* args, size_t needed, const char* call) {
  if (!plugin::has_size(args, args != nullptr ? args->struct_size : 0, needed)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  format("%s: args is NULL or its struct_size is below %zu", call, needed)};
  }
}

void check_device(uint32_t device) {
  if (device != 0) {
    throw Failure{DEVALLOC_STATUS_NO_SUCH_DEVICE, "no such device (the host plugin has 1)"};
  }
}

void check_reserved(uint32_t reserved) {
  if (reserved != 0) throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "reserved0 is not 0"};
}

const char* lifetime_name(devalloc_src_lifetime lifetime) {
  switch (lifetime) {
    case DEVALLOC_SRC_DURING_CALL: return "during_call";
    case DEVALLOC_SRC_UNTIL_RELEASED: return "until_released";
    default: return "unknown";
  }
}

devalloc_status create(devalloc_create_args* args, devalloc_error* error) {
  return guard(error, [&] {
    check_args(args, DEVALLOC_STRUCT_SIZE(devalloc_create_args, instance), "create");
    return in_call([&] { return format("create(option_count = %zu)", args->option_count); },
                   [&] {
                     plugin::Options options(*args);
                     const bool async = breaks_during_call || options.take_bool("async", false);
                     const auto faults = FaultPlan::take_settings(options);
                     options.reject_unknown(plugin_name, accepted_options);
                     args->instance = new devalloc_instance(async, faults);
                   });
  });
}

void destroy(devalloc_instance* instance) { delete instance; }

devalloc_status get_capabilities(devalloc_instance* instance,
                                 devalloc_capabilities* capabilities, devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "get_capabilities");
    check_args(capabilities, DEVALLOC_STRUCT_SIZE(devalloc_capabilities, max_alignment),
               "get_capabilities");
    capabilities->flags = DEVALLOC_CAPABILITY_HOST_STAGING |
                          (self.device.async() ? DEVALLOC_CAPABILITY_ASYNC_COPY : 0);
    capabilities->max_alignment = HostDevice::max_alignment;
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status get_device_count(devalloc_instance* instance, uint32_t* count,
                                 devalloc_error* error) {
  return guard(error, [&] {
    checked(instance, "get_device_count");
    if (count == nullptr) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "get_device_count: count is NULL"};
    }
    *count = 1;
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status get_device_properties(devalloc_instance* instance, uint32_t device,
                                      devalloc_device_properties* properties,
                                      devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "get_device_properties");
    check_args(properties, DEVALLOC_STRUCT_SIZE(devalloc_device_properties, dlpack_device_id),
               "get_device_properties");
    return in_call([&] { return format("get_device_properties(device = %u)", device); }, [&] {
      check_device(device);
      std::snprintf(properties->name, sizeof properties->name, "%s", "host memory");
      properties->total_memory_bytes = self.device.total_memory();
      std::memset(properties->uuid, 0, sizeof properties->uuid);
      properties->pci_bus_id[0] = '\0';
      properties->dlpack_device_type = DEVALLOC_DLPACK_CPU;
      properties->dlpack_device_id = 0;
    });
  });
}

devalloc_status allocate(devalloc_instance* instance, devalloc_allocate_args* args,
                         devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "allocate");
    check_args(args, DEVALLOC_STRUCT_SIZE(devalloc_allocate_args, address), "allocate");
    return in_call(
        [&] {
          return format("allocate(device = %u, nbytes = %" PRIu64 ", alignment = %" PRIu64 ")",
                        args->device, args->nbytes, args->alignment);
        },
        [&] {
          check_device(args->device);
          check_reserved(args->reserved0);
          self.faults.before_allocate();
          args->address = self.device.allocate(args->nbytes, args->alignment);
        });
  });
}

devalloc_status deallocate(devalloc_instance* instance, uint32_t device,
                           devalloc_device_address address, devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "deallocate");
    return in_call(
        [&] { return format("deallocate(device = %u, address = 0x%" PRIx64 ")", device, address); },
        [&] {
          check_device(device);
          self.device.deallocate(address);
        });
  });
}

devalloc_status copy_host_to_device(devalloc_instance* instance,
                                    const devalloc_copy_to_device_args* args,
                                    devalloc_error* error) {
  return guard(error, [&] {
    check_args(args, DEVALLOC_STRUCT_SIZE(devalloc_copy_to_device_args, user_data),
               "copy_host_to_device");
    // Taken before anything else can fail, so that every later failure still
    // releases the source exactly once.
    Release release(args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED ? args->on_release : nullptr,
                    args->user_data);
    auto& self = checked(instance, "copy_host_to_device");
    return in_call(
        [&] {
          return format("copy_host_to_device(device = %u, dst = 0x%" PRIx64 ", nbytes = %" PRIu64
                        ", src_lifetime = %s)",
                        args->device, args->dst, args->nbytes, lifetime_name(args->src_lifetime));
        },
        [&] {
          check_device(args->device);
          const auto lifetime = args->src_lifetime;
          if (lifetime != DEVALLOC_SRC_DURING_CALL && lifetime != DEVALLOC_SRC_UNTIL_RELEASED) {
            throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                          format("unknown src_lifetime %" PRIu32, lifetime)};
          }
          if (args->nbytes == 0) return;
          if (args->src == nullptr) {
            throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "src is NULL"};
          }
          if (self.faults.before_copy()) {
            const auto* src = static_cast<const std::byte*>(args->src);
            std::vector<std::byte> corrupted(src, src + args->nbytes);
            corrupted[0] ^= std::byte{0xff};
            self.device.copy_now(args->dst, corrupted.data(), args->nbytes);
          } else if (lifetime == DEVALLOC_SRC_UNTIL_RELEASED) {
            self.device.copy_later(args->dst, args->src, args->nbytes, std::move(release));
          } else if (breaks_during_call) {
            self.device.copy_later(args->dst, args->src, args->nbytes, Release{},
                                   during_call_read_delay);
          } else {
            self.device.copy_now(args->dst, args->src, args->nbytes);
          }
        });
  });
}

devalloc_status copy_device_to_host(devalloc_instance* instance,
                                    const devalloc_copy_to_host_args* args,
                                    devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "copy_device_to_host");
    check_args(args, DEVALLOC_STRUCT_SIZE(devalloc_copy_to_host_args, nbytes),
               "copy_device_to_host");
    return in_call(
        [&] {
          return format("copy_device_to_host(device = %u, src = 0x%" PRIx64 ", nbytes = %" PRIu64
                        ")",
                        args->device, args->src, args->nbytes);
        },
        [&] {
          check_device(args->device);
          check_reserved(args->reserved0);
          if (args->nbytes == 0) return;
          if (args->dst == nullptr) {
            throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "dst is NULL"};
          }
          self.device.copy_to_host(args->dst, args->src, args->nbytes);
        });
  });
}

devalloc_status synchronize(devalloc_instance* instance, uint32_t device, devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "synchronize");
    return in_call([&] { return format("synchronize(device = %u)", device); }, [&] {
      check_device(device);
      self.device.synchronize();
      self.faults.after_synchronize();
    });
  });
}

devalloc_status allocate_host(devalloc_instance* instance, uint64_t nbytes, void** host,
                              devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "allocate_host");
    return in_call([&] { return format("allocate_host(nbytes = %" PRIu64 ")", nbytes); }, [&] {
      if (host == nullptr) throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "host is NULL"};
      *host = self.device.allocate_host(nbytes);
    });
  });
}

devalloc_status free_host(devalloc_instance* instance, void* host, devalloc_error* error) {
  return guard(error, [&] {
    auto& self = checked(instance, "free_host");
    return in_call([&] { return format("free_host(host = %p)", host); },
                   [&] { self.device.free_host(host); });
  });
}

const devalloc_plugin_api_v1 api_v1 = {
    .struct_size = sizeof(devalloc_plugin_api_v1),
    .abi_major = DEVALLOC_ABI_VERSION_MAJOR,
    .abi_minor = DEVALLOC_ABI_VERSION_MINOR,
    .plugin_name = plugin_name,
    .plugin_version = DEVALLOC_HOST_PLUGIN_VERSION,
    .create = create,
    .destroy = destroy,
    .get_capabilities = get_capabilities,
    .get_device_count = get_device_count,
    .get_device_properties = get_device_properties,
    .allocate = allocate,
    .deallocate = deallocate,
    .copy_host_to_device = copy_host_to_device,
    .copy_device_to_host = copy_device_to_host,
    .synchronize = synchronize,
    .allocate_host = allocate_host,
    .free_host = free_host,
};

}  // namespace
}  // namespace devalloc::host

devalloc_status devalloc_plugin_negotiate(devalloc_negotiation* negotiation,
                                          devalloc_error* error) {
  return devalloc::plugin::guard(error, [&] {
    return devalloc::plugin::negotiate_v1(negotiation, error, &devalloc::host::api_v1);
  });
}
