// A plugin of the zoo written in C++ that lets exceptions out through the C
// ABI (it breaks PLUGIN-7): allocate of 13 bytes throws a std::runtime_error,
// a copy of 13 bytes throws an int, and destroy throws; with the option
// throw_in = "get_device_count", get_device_count throws a
// std::runtime_error. Everything else works on one device of host memory. The loader must turn each throw into
// the call's failure (loader/src/guarded_call.hpp), never let it reach a
// caller that expects a status, and never end the process.
//
// Built a second time with DEVALLOC_ZOO_THROWING_INITIALIZER: then a static
// initializer throws, inside dlopen, which nothing can survive (PLUGIN-7):
// the process that opens it ends (std::terminate).
#include <devalloc/plugin_abi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

struct devalloc_instance {
  bool get_device_count_throws = false;
  std::mutex mutex;
  std::map<uint64_t, void*> allocations;  // address -> malloc'd block
};

namespace {

constexpr uint64_t kThrowingSize = 13;

devalloc_status fail(devalloc_error* error, devalloc_status status, const char* message) {
  if (error != nullptr) std::snprintf(error->message, sizeof error->message, "%s", message);
  return status;
}

devalloc_status create(devalloc_create_args* args, devalloc_error* error) {
  if (args == nullptr) return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "NULL args");
  bool count_throws = false;
  for (size_t i = 0; i < args->option_count; ++i) {
    if (std::strcmp(args->option_keys[i], "throw_in") == 0 &&
        std::strcmp(args->option_values[i], "get_device_count") == 0) {
      count_throws = true;
    } else {
      return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "zoo_throws: the one option is throw_in = \"get_device_count\"");
    }
  }
  args->instance = new devalloc_instance();
  args->instance->get_device_count_throws = count_throws;
  return DEVALLOC_STATUS_OK;
}

void destroy(devalloc_instance* z) {
  for (const auto& [address, block] : z->allocations) std::free(block);
  delete z;
  throw std::logic_error("zoo_throws: destroy throws too");
}

devalloc_status get_capabilities(devalloc_instance*, devalloc_capabilities* c,
                                 devalloc_error* error) {
  if (c == nullptr || c->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_capabilities, max_alignment)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "capabilities NULL or too small");
  }
  c->flags = 0;
  c->max_alignment = 4096;
  return DEVALLOC_STATUS_OK;
}

devalloc_status get_device_count(devalloc_instance* z, uint32_t* count, devalloc_error* error) {
  if (z->get_device_count_throws) throw std::runtime_error("get_device_count exploded");
  if (count == nullptr) return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "NULL count");
  *count = 1;
  return DEVALLOC_STATUS_OK;
}

devalloc_status get_device_properties(devalloc_instance*, uint32_t device,
                                      devalloc_device_properties* p, devalloc_error* error) {
  if (p == nullptr || p->struct_size < sizeof(devalloc_device_properties)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "properties NULL or too small");
  }
  if (device != 0) return fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "one device only");
  std::snprintf(p->name, sizeof p->name, "throwing memory");
  p->total_memory_bytes = uint64_t{1} << 30;
  p->dlpack_device_type = DEVALLOC_DLPACK_CPU;
  return DEVALLOC_STATUS_OK;
}

devalloc_status allocate(devalloc_instance* z, devalloc_allocate_args* args,
                         devalloc_error* error) {
  if (args == nullptr || args->device != 0) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "bad arguments");
  }
  if (args->nbytes == kThrowingSize) throw std::runtime_error("allocate exploded");
  if (args->nbytes == 0) {
    args->address = 0;
    return DEVALLOC_STATUS_OK;
  }
  void* block = std::aligned_alloc(4096, (args->nbytes + 4095) / 4096 * 4096);
  if (block == nullptr) return fail(error, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "no memory");
  std::lock_guard lock(z->mutex);
  args->address = reinterpret_cast<uintptr_t>(block);
  z->allocations[args->address] = block;
  return DEVALLOC_STATUS_OK;
}

devalloc_status deallocate(devalloc_instance* z, uint32_t, devalloc_device_address address,
                           devalloc_error* error) {
  if (address == 0) return DEVALLOC_STATUS_OK;
  std::lock_guard lock(z->mutex);
  auto it = z->allocations.find(address);
  if (it == z->allocations.end()) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "unknown address");
  }
  std::free(it->second);
  z->allocations.erase(it);
  return DEVALLOC_STATUS_OK;
}

devalloc_status copy_host_to_device(devalloc_instance*, const devalloc_copy_to_device_args* args,
                                    devalloc_error* error) {
  if (args == nullptr) return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "NULL args");
  if (args->nbytes == kThrowingSize) throw 42;
  if (args->nbytes != 0) {
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(args->dst)), args->src,
                args->nbytes);
  }
  if (args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED && args->on_release != nullptr) {
    args->on_release(args->user_data);
  }
  return DEVALLOC_STATUS_OK;
}

devalloc_status copy_device_to_host(devalloc_instance*, const devalloc_copy_to_host_args* args,
                                    devalloc_error* error) {
  if (args == nullptr) return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "NULL args");
  if (args->nbytes != 0) {
    std::memcpy(args->dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(args->src)),
                args->nbytes);
  }
  return DEVALLOC_STATUS_OK;
}

devalloc_status synchronize(devalloc_instance*, uint32_t, devalloc_error*) {
  return DEVALLOC_STATUS_OK;
}

#if defined(DEVALLOC_ZOO_THROWING_INITIALIZER)
struct ThrowsWhenConstructed {
  ThrowsWhenConstructed() { throw std::runtime_error("zoo_throws: static initializer threw"); }
};
const ThrowsWhenConstructed throws_when_constructed;
#endif

const devalloc_plugin_api_v1 kApi = [] {
  devalloc_plugin_api_v1 api{};
  api.struct_size = sizeof api;
  api.abi_major = DEVALLOC_ABI_VERSION_MAJOR;
  api.abi_minor = DEVALLOC_ABI_VERSION_MINOR;
  api.plugin_name = "zoo_throws";
  api.plugin_version = "0";
  api.create = create;
  api.destroy = destroy;
  api.get_capabilities = get_capabilities;
  api.get_device_count = get_device_count;
  api.get_device_properties = get_device_properties;
  api.allocate = allocate;
  api.deallocate = deallocate;
  api.copy_host_to_device = copy_host_to_device;
  api.copy_device_to_host = copy_device_to_host;
  api.synchronize = synchronize;
  return api;
}();

}  // namespace

extern "C" DEVALLOC_PLUGIN_EXPORT devalloc_status devalloc_plugin_negotiate(
    devalloc_negotiation* n, devalloc_error* error) {
  if (n == nullptr || n->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "negotiation NULL or too small");
  }
  n->plugin_major = DEVALLOC_ABI_VERSION_MAJOR;
  n->plugin_minor = DEVALLOC_ABI_VERSION_MINOR;
  n->plugin_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  n->api = &kApi;
  return DEVALLOC_STATUS_OK;
}
