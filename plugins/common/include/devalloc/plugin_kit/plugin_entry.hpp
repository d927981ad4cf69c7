// The ABI function table of a kit plugin, generated from one description:
//
//   struct MyPlugin {
//     static constexpr const char* name = "my";
//     static constexpr const char* version = "1.0.0";
//     // Takes its options (reject_unknown() included) and returns the
//     // instance; throws Failure.
//     static std::unique_ptr<devalloc_instance> create(devalloc::plugin::Options&);
//     // Optional: the instance overrides memory_info (ABI 1.1).
//     static constexpr bool offers_memory_info = true;
//     // Optional: the instance overrides map_to_host / unmap_from_host and
//     // sets DEVALLOC_CAPABILITY_HOST_MAPPABLE (ABI 1.2, PLUGIN-22).
//     static constexpr bool offers_host_mapping = true;
//   };
//   DEVALLOC_PLUGIN_KIT_ENTRY_POINT(MyPlugin)
//
// Every function checks its arguments (struct sizes, NULLs, device index,
// alignment, src_lifetime) with messages naming the call and the PLUGIN rule,
// takes an until-released copy's release before anything can fail, puts the
// call and its arguments in front of every failure, and lets no exception out.
#pragma once

#include <devalloc/plugin_abi.h>
#include <devalloc/plugin_kit/abi_glue.hpp>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/options.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace devalloc::plugin {

namespace detail {
// The option runtime_library when given (non-empty), else the defaults; any
// other key is refused (PLUGIN-8).
inline std::vector<std::string> runtime_libraries(Options& options, const char* plugin,
                                                  std::initializer_list<const char*> defaults) {
  std::string configured;
  const bool given = options.take("runtime_library", configured);
  options.reject_unknown(plugin, "runtime_library");
  if (!given) return std::vector<std::string>(defaults.begin(), defaults.end());
  if (configured.empty()) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  std::string(plugin) + ": option runtime_library is empty"};
  }
  return {configured};
}

// VendorInstance(library); whatever fails while the runtime is set up makes
// the plugin unavailable: RUNTIME_UNAVAILABLE, "<plugin>: <reason>".
template <class VendorInstance, class Library>
std::unique_ptr<Instance> create_unavailable_on_failure(const char* plugin,
                                                        const Library& library) {
  try {
    return std::make_unique<VendorInstance>(library);
  } catch (Failure& failure) {
    failure.status = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE;
    failure.message.insert(0, std::string(plugin) + ": ");
    throw;
  }
}
}  // namespace detail

// The usual create() of a vendor plugin: the one option runtime_library
// (default_library when absent; any other key is refused, PLUGIN-8), then
// VendorInstance(library). Whatever fails while the runtime is set up makes
// the plugin unavailable: RUNTIME_UNAVAILABLE, "<plugin>: <reason>".
template <class VendorInstance>
std::unique_ptr<Instance> create_over_runtime(Options& options, const char* plugin,
                                              const char* default_library) {
  const std::vector<std::string> libraries =
      detail::runtime_libraries(options, plugin, {default_library});
  return detail::create_unavailable_on_failure<VendorInstance>(plugin, libraries.front());
}

// The same for a runtime whose soname changes with its major release:
// VendorInstance(libraries) opens the first of them that it can
// (RuntimeLibrary's list constructor): the configured library alone, or
// default_libraries in order.
template <class VendorInstance>
std::unique_ptr<Instance> create_over_runtime(
    Options& options, const char* plugin, std::initializer_list<const char*> default_libraries) {
  return detail::create_unavailable_on_failure<VendorInstance>(
      plugin, detail::runtime_libraries(options, plugin, default_libraries));
}

template <class Plugin>
struct PluginApi {
  static Instance& instance_of(devalloc_instance* instance, const char* call) {
    require(instance != nullptr, call, "PLUGIN-3", "instance is NULL");
    return *instance;
  }

  static devalloc_status create(devalloc_create_args* args, devalloc_error* error) {
    return guard(error, [&] {
      require_struct(args, DEVALLOC_STRUCT_SIZE(devalloc_create_args, instance), "create", "args");
      args->instance = nullptr;
      Options options(*args);
      args->instance = Plugin::create(options).release();
      return DEVALLOC_STATUS_OK;
    });
  }

  static void destroy(devalloc_instance* instance) { delete instance; }

  static devalloc_status get_capabilities(devalloc_instance* instance,
                                          devalloc_capabilities* capabilities,
                                          devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "get_capabilities");
      require_struct(capabilities, DEVALLOC_STRUCT_SIZE(devalloc_capabilities, max_alignment),
                     "get_capabilities", "capabilities");
      capabilities->flags = self.capability_flags();
      capabilities->max_alignment = self.max_alignment();
#if DEVALLOC_ABI_VERSION_MINOR >= 2
      // Written only into a struct that has them (PLUGIN-4).
      if (capabilities->struct_size >= DEVALLOC_CAPABILITIES_V1_2_SIZE) {
        const CopyConstraints c = self.copy_constraints();
        capabilities->copy_src_alignment = c.src_alignment;
        capabilities->copy_preferred_bytes = c.preferred_bytes;
        capabilities->copy_max_bytes = c.max_bytes;
      }
#endif
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status get_device_count(devalloc_instance* instance, uint32_t* count,
                                          devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "get_device_count");
      require(count != nullptr, "get_device_count", "PLUGIN-10", "count is NULL");
      *count = self.device_count();
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status get_device_properties(devalloc_instance* instance, uint32_t device,
                                               devalloc_device_properties* properties,
                                               devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "get_device_properties");
      require_struct(properties,
                     DEVALLOC_STRUCT_SIZE(devalloc_device_properties, dlpack_device_id),
                     "get_device_properties", "properties");
      require_device(device, self.device_count(), "get_device_properties");
      in_call([&] { return format("get_device_properties(device = %u)", device); }, [&] {
        const DeviceDescription d = self.describe(device);
        copy_text(properties->name, sizeof properties->name, d.name);
        properties->total_memory_bytes = d.total_memory_bytes;
        std::memcpy(properties->uuid, d.uuid.data(), sizeof properties->uuid);
        copy_text(properties->pci_bus_id, sizeof properties->pci_bus_id, d.pci_bus_id);
        properties->dlpack_device_type = d.dlpack_device_type;
        properties->dlpack_device_id = d.dlpack_device_id;
#if DEVALLOC_ABI_VERSION_MINOR >= 2
        if (properties->struct_size >= DEVALLOC_DEVICE_PROPERTIES_V1_2_SIZE) {
          copy_text(properties->memory_kind, sizeof properties->memory_kind, d.memory_kind);
        }
#endif
      });
      return DEVALLOC_STATUS_OK;
    });
  }

#if DEVALLOC_ABI_VERSION_MINOR >= 1
  static devalloc_status get_memory_info(devalloc_instance* instance, uint32_t device,
                                         uint64_t* free_bytes, uint64_t* total_bytes,
                                         devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "get_memory_info");
      require(free_bytes != nullptr && total_bytes != nullptr, "get_memory_info",
              "PLUGIN-10", "free_bytes or total_bytes is NULL");
      require_device(device, self.device_count(), "get_memory_info");
      MemoryInfo info;
      in_call([&] { return format("get_memory_info(device = %u)", device); },
              [&] { info = self.memory_info(device); });
      *free_bytes = info.free_bytes;
      *total_bytes = info.total_bytes;
      return DEVALLOC_STATUS_OK;
    });
  }
#endif

#if DEVALLOC_ABI_VERSION_MINOR >= 2
  static devalloc_status map_to_host(devalloc_instance* instance, devalloc_map_args* args,
                                     devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "map_to_host");
      require_struct(args, DEVALLOC_STRUCT_SIZE(devalloc_map_args, host), "map_to_host", "args");
      args->host = nullptr;
      in_call(
          [&] {
            return format("map_to_host(device = %u, address = 0x%" PRIx64 ", nbytes = %" PRIu64
                          ")",
                          args->device, args->address, args->nbytes);
          },
          [&] {
            require(args->reserved0 == 0, "map_to_host", "PLUGIN-4", "reserved0 is not 0");
            require_device(args->device, self.device_count(), "map_to_host");
            require(args->nbytes > 0, "map_to_host", "PLUGIN-22", "nbytes is 0");
            args->host = self.map_to_host(args->device, args->address, args->nbytes);
          });
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status unmap_from_host(devalloc_instance* instance, uint32_t device,
                                         void* host, devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "unmap_from_host");
      in_call([&] { return format("unmap_from_host(device = %u, host = %p)", device, host); },
              [&] {
                require_device(device, self.device_count(), "unmap_from_host");
                require(host != nullptr, "unmap_from_host", "PLUGIN-22", "host is NULL");
                self.unmap_from_host(device, host);
              });
      return DEVALLOC_STATUS_OK;
    });
  }
#endif

  static devalloc_status allocate(devalloc_instance* instance, devalloc_allocate_args* args,
                                  devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "allocate");
      require_struct(args, DEVALLOC_STRUCT_SIZE(devalloc_allocate_args, address), "allocate",
                     "args");
      in_call(
          [&] {
            return format("allocate(device = %u, nbytes = %" PRIu64 ", alignment = %" PRIu64 ")",
                          args->device, args->nbytes, args->alignment);
          },
          [&] {
            require(args->reserved0 == 0, "allocate", "PLUGIN-4", "reserved0 is not 0");
            require_device(args->device, self.device_count(), "allocate");
            const uint64_t natural = self.natural_alignment();
            const uint64_t alignment = std::max(
                checked_alignment(args->alignment, natural, self.max_alignment()), natural);
            args->address =
                args->nbytes == 0 ? 0 : self.allocate(args->device, args->nbytes, alignment);
          });
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status deallocate(devalloc_instance* instance, uint32_t device,
                                    devalloc_device_address address, devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "deallocate");
      in_call(
          [&] {
            return format("deallocate(device = %u, address = 0x%" PRIx64 ")", device, address);
          },
          [&] {
            require_device(device, self.device_count(), "deallocate");
            if (address != 0) self.deallocate(device, address);
          });
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status copy_host_to_device(devalloc_instance* instance,
                                             const devalloc_copy_to_device_args* args,
                                             devalloc_error* error) {
    return guard(error, [&] {
      require_struct(args, DEVALLOC_STRUCT_SIZE(devalloc_copy_to_device_args, user_data),
                     "copy_host_to_device", "args");
      // Taken before anything else can fail, so that every later failure
      // still releases the source exactly once (PLUGIN-14).
      Release release(args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED ? args->on_release
                                                                         : nullptr,
                      args->user_data);
      Instance& self = instance_of(instance, "copy_host_to_device");
      in_call(
          [&] {
            return format("copy_host_to_device(device = %u, dst = 0x%" PRIx64
                          ", nbytes = %" PRIu64 ", src_lifetime = %s)",
                          args->device, args->dst, args->nbytes,
                          lifetime_name(args->src_lifetime));
          },
          [&] {
            require_device(args->device, self.device_count(), "copy_host_to_device");
            const auto lifetime = args->src_lifetime;
            require(lifetime == DEVALLOC_SRC_DURING_CALL || lifetime == DEVALLOC_SRC_UNTIL_RELEASED,
                    "copy_host_to_device", "PLUGIN-13/14", "unknown src_lifetime");
            if (args->nbytes == 0) return;
            require(args->src != nullptr, "copy_host_to_device", "PLUGIN-15",
                    "src is NULL with nbytes > 0");
            if (lifetime == DEVALLOC_SRC_UNTIL_RELEASED) {
              self.copy_until_released(args->device, args->dst, args->src, args->nbytes,
                                       std::move(release));
            } else {
              self.copy_during_call(args->device, args->dst, args->src, args->nbytes);
            }
          });
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status copy_device_to_host(devalloc_instance* instance,
                                             const devalloc_copy_to_host_args* args,
                                             devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "copy_device_to_host");
      require_struct(args, DEVALLOC_STRUCT_SIZE(devalloc_copy_to_host_args, nbytes),
                     "copy_device_to_host", "args");
      in_call(
          [&] {
            return format("copy_device_to_host(device = %u, src = 0x%" PRIx64
                          ", nbytes = %" PRIu64 ")",
                          args->device, args->src, args->nbytes);
          },
          [&] {
            require(args->reserved0 == 0, "copy_device_to_host", "PLUGIN-4",
                    "reserved0 is not 0");
            require_device(args->device, self.device_count(), "copy_device_to_host");
            if (args->nbytes == 0) return;
            require(args->dst != nullptr, "copy_device_to_host", "PLUGIN-16",
                    "dst is NULL with nbytes > 0");
            self.copy_to_host(args->device, args->dst, args->src, args->nbytes);
          });
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status synchronize(devalloc_instance* instance, uint32_t device,
                                     devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "synchronize");
      in_call([&] { return format("synchronize(device = %u)", device); }, [&] {
        require_device(device, self.device_count(), "synchronize");
        self.synchronize(device);
      });
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status allocate_host(devalloc_instance* instance, uint64_t nbytes, void** host,
                                       devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "allocate_host");
      require(host != nullptr, "allocate_host", "PLUGIN-18", "host is NULL");
      *host = nullptr;
      in_call([&] { return format("allocate_host(nbytes = %" PRIu64 ")", nbytes); }, [&] {
        if (nbytes > 0) *host = self.allocate_host(nbytes);
      });
      return DEVALLOC_STATUS_OK;
    });
  }

  static devalloc_status free_host(devalloc_instance* instance, void* host,
                                   devalloc_error* error) {
    return guard(error, [&] {
      Instance& self = instance_of(instance, "free_host");
      in_call([&] { return format("free_host(host = %p)", host); }, [&] {
        if (host != nullptr) self.free_host(host);
      });
      return DEVALLOC_STATUS_OK;
    });
  }

  // get_memory_info is in the table only for a plugin that declares
  // static constexpr bool offers_memory_info = true (and overrides
  // Instance::memory_info); for others it is NULL: "not supported".
  static constexpr bool offers_memory_info() {
    if constexpr (requires { Plugin::offers_memory_info; }) {
      return Plugin::offers_memory_info;
    } else {
      return false;
    }
  }

  // map_to_host and unmap_from_host are in the table only for a plugin that
  // declares static constexpr bool offers_host_mapping = true.
  static constexpr bool offers_host_mapping() {
    if constexpr (requires { Plugin::offers_host_mapping; }) {
      return Plugin::offers_host_mapping;
    } else {
      return false;
    }
  }

  // The table's struct_size: a plugin may declare an older ABI's size
  // (static constexpr size_t api_struct_size) to hand out what a plugin
  // built against that header would.
  static constexpr size_t table_size() {
    if constexpr (requires { Plugin::api_struct_size; }) {
      return Plugin::api_struct_size;
    } else {
      return sizeof(devalloc_plugin_api_v1);
    }
  }

  static constexpr devalloc_plugin_api_v1 table = {
      .struct_size = table_size(),
      .abi_major = DEVALLOC_ABI_VERSION_MAJOR,
      .abi_minor = DEVALLOC_ABI_VERSION_MINOR,
      .plugin_name = Plugin::name,
      .plugin_version = Plugin::version,
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
#if DEVALLOC_ABI_VERSION_MINOR >= 1
      .get_memory_info = offers_memory_info() ? get_memory_info : nullptr,
#endif
#if DEVALLOC_ABI_VERSION_MINOR >= 2
      .map_to_host = offers_host_mapping() ? map_to_host : nullptr,
      .unmap_from_host = offers_host_mapping() ? unmap_from_host : nullptr,
#endif
  };
};

}  // namespace devalloc::plugin

// Defines the plugin's one exported symbol over PluginApi<Plugin>::table.
#define DEVALLOC_PLUGIN_KIT_ENTRY_POINT(Plugin)                                            \
  extern "C" DEVALLOC_PLUGIN_EXPORT devalloc_status devalloc_plugin_negotiate(            \
      devalloc_negotiation* negotiation, devalloc_error* error) {                          \
    return ::devalloc::plugin::negotiate_v1(negotiation, error,                            \
                                            &::devalloc::plugin::PluginApi<Plugin>::table); \
  }
