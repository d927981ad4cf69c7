/*
 * A complete devalloc plugin as a vendor would write it: one file, built
 * against an installed devalloc, using nothing but <devalloc/plugin_abi.h>.
 *
 * Its one device is ordinary host memory and every copy is a memcpy done
 * inside the call, so both source lifetimes are trivially honoured and
 * synchronize() has nothing to wait for. A real plugin replaces the memory
 * functions with its vendor runtime's and keeps the validation as it is.
 */
#define _POSIX_C_SOURCE 200112L

#include <devalloc/plugin_abi.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXAMPLE_NATURAL_ALIGNMENT 256u
#define EXAMPLE_MAX_ALIGNMENT ((uint64_t)1 << 16)

typedef struct allocation {
  uint64_t base;
  uint64_t nbytes;
} allocation;

/* The vendor runtime would know its own allocations; this one keeps a list
 * to check copy ranges and frees. The mutex makes every call thread-safe. */
struct devalloc_instance {
  pthread_mutex_t mutex;
  allocation* live;
  size_t live_count;
  size_t live_capacity;
  uint64_t total_memory;
};

static devalloc_status fail(devalloc_error* error, devalloc_status status, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

static devalloc_status fail(devalloc_error* error, devalloc_status status, const char* format, ...) {
  if (error != NULL && error->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_error, message)) {
    va_list args;
    va_start(args, format);
    vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
  }
  return status;
}

static void* as_pointer(uint64_t address) { return (void*)(uintptr_t)address; }

/* Index of the allocation holding [address, address + nbytes), or -1. Call
 * with the mutex held. */
static long find_range(const devalloc_instance* self, uint64_t address, uint64_t nbytes) {
  for (size_t i = 0; i < self->live_count; ++i) {
    const allocation* a = &self->live[i];
    if (address >= a->base && address - a->base <= a->nbytes &&
        nbytes <= a->nbytes - (address - a->base)) {
      return (long)i;
    }
  }
  return -1;
}

static devalloc_status example_create(devalloc_create_args* args, devalloc_error* error) {
  if (args == NULL || args->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_create_args, instance)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "create: args is NULL or too small");
  }
  if (args->option_count > 0) {
    const char* key = args->option_keys != NULL ? args->option_keys[0] : NULL;
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                "create: unknown option \"%s\" (the example plugin takes none)",
                key != NULL ? key : "(null)");
  }
  devalloc_instance* self = calloc(1, sizeof *self);
  if (self == NULL) return fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "create: out of host memory");
  pthread_mutex_init(&self->mutex, NULL);
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  self->total_memory = pages > 0 && page_size > 0 ? (uint64_t)pages * (uint64_t)page_size : 0;
  args->instance = self;
  return DEVALLOC_STATUS_OK;
}

/* Copies are synchronous: nothing is pending, there is nothing to release. */
static void example_destroy(devalloc_instance* self) {
  if (self == NULL) return;
  for (size_t i = 0; i < self->live_count; ++i) free(as_pointer(self->live[i].base));
  free(self->live);
  pthread_mutex_destroy(&self->mutex);
  free(self);
}

static devalloc_status example_get_capabilities(devalloc_instance* self,
                                                devalloc_capabilities* capabilities,
                                                devalloc_error* error) {
  if (self == NULL || capabilities == NULL ||
      capabilities->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_capabilities, max_alignment)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "get_capabilities: NULL or too small");
  }
  capabilities->flags = 0;
  capabilities->max_alignment = EXAMPLE_MAX_ALIGNMENT;
  return DEVALLOC_STATUS_OK;
}

static devalloc_status example_get_device_count(devalloc_instance* self, uint32_t* count,
                                                devalloc_error* error) {
  if (self == NULL || count == NULL) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "get_device_count: NULL argument");
  }
  *count = 1;
  return DEVALLOC_STATUS_OK;
}

static devalloc_status example_get_device_properties(devalloc_instance* self, uint32_t device,
                                                     devalloc_device_properties* properties,
                                                     devalloc_error* error) {
  if (self == NULL || properties == NULL ||
      properties->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_device_properties, dlpack_device_id)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "get_device_properties: NULL or too small");
  }
  if (device != 0) {
    return fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "get_device_properties(device = %" PRIu32
                "): no such device", device);
  }
  snprintf(properties->name, sizeof properties->name, "example host memory");
  properties->total_memory_bytes = self->total_memory;
  memset(properties->uuid, 0, sizeof properties->uuid);
  properties->pci_bus_id[0] = '\0';
  properties->dlpack_device_type = DEVALLOC_DLPACK_CPU;
  properties->dlpack_device_id = 0;
  return DEVALLOC_STATUS_OK;
}

/* Every failure names the call and its arguments. */
#define EXAMPLE_ALLOCATE_CALL \
  "allocate(device = %" PRIu32 ", nbytes = %" PRIu64 ", alignment = %" PRIu64 ")"

static devalloc_status example_allocate(devalloc_instance* self, devalloc_allocate_args* args,
                                        devalloc_error* error) {
  if (self == NULL || args == NULL ||
      args->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_allocate_args, address)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "allocate: NULL or too small");
  }
  const uint64_t alignment = args->alignment == 0 ? EXAMPLE_NATURAL_ALIGNMENT : args->alignment;
  if (args->device != 0) {
    return fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, EXAMPLE_ALLOCATE_CALL ": no such device",
                args->device, args->nbytes, args->alignment);
  }
  if (args->reserved0 != 0 || (alignment & (alignment - 1)) != 0) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                EXAMPLE_ALLOCATE_CALL ": alignment is not a power of two or reserved0 is not 0",
                args->device, args->nbytes, args->alignment);
  }
  if (alignment > EXAMPLE_MAX_ALIGNMENT) {
    return fail(error, DEVALLOC_STATUS_UNSUPPORTED, EXAMPLE_ALLOCATE_CALL ": alignment too large",
                args->device, args->nbytes, args->alignment);
  }
  args->address = 0;
  if (args->nbytes == 0) return DEVALLOC_STATUS_OK;
  void* p = NULL;
  /* Refused before malloc: with overcommit a huge request would succeed and
   * fail only when touched. */
  if (args->nbytes > self->total_memory ||
      posix_memalign(&p, alignment < EXAMPLE_NATURAL_ALIGNMENT ? EXAMPLE_NATURAL_ALIGNMENT : alignment,
                     args->nbytes) != 0) {
    return fail(error, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, EXAMPLE_ALLOCATE_CALL ": out of device memory",
                args->device, args->nbytes, args->alignment);
  }
  pthread_mutex_lock(&self->mutex);
  if (self->live_count == self->live_capacity) {
    const size_t capacity = self->live_capacity ? 2 * self->live_capacity : 16;
    allocation* grown = realloc(self->live, capacity * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&self->mutex);
      free(p);
      return fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "allocate: out of host memory");
    }
    self->live = grown;
    self->live_capacity = capacity;
  }
  self->live[self->live_count].base = (uint64_t)(uintptr_t)p;
  self->live[self->live_count].nbytes = args->nbytes;
  ++self->live_count;
  pthread_mutex_unlock(&self->mutex);
  args->address = (uint64_t)(uintptr_t)p;
  return DEVALLOC_STATUS_OK;
}

static devalloc_status example_deallocate(devalloc_instance* self, uint32_t device,
                                          devalloc_device_address address, devalloc_error* error) {
  if (self == NULL) return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "deallocate: instance is NULL");
  if (device != 0) {
    return fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "deallocate(device = %" PRIu32 "): no such device",
                device);
  }
  if (address == 0) return DEVALLOC_STATUS_OK;
  pthread_mutex_lock(&self->mutex);
  for (size_t i = 0; i < self->live_count; ++i) {
    if (self->live[i].base == address) {
      self->live[i] = self->live[--self->live_count];
      pthread_mutex_unlock(&self->mutex);
      free(as_pointer(address));
      return DEVALLOC_STATUS_OK;
    }
  }
  pthread_mutex_unlock(&self->mutex);
  return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
              "deallocate(device = 0, address = 0x%" PRIx64 "): not a live allocation", address);
}

/* A copy is validated and done under the mutex, so that a concurrent
 * deallocate() cannot free the memory under it. */
static devalloc_status copy_locked(devalloc_instance* self, const char* call,
                                   const char* address_name, uint32_t device, uint64_t address,
                                   void* dst, const void* src, uint64_t nbytes,
                                   devalloc_error* error) {
  if (device != 0) {
    return fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "%s(device = %" PRIu32 "): no such device",
                call, device);
  }
  if (nbytes == 0) return DEVALLOC_STATUS_OK;
  if (dst == NULL || src == NULL) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "%s(nbytes = %" PRIu64 "): host pointer is NULL",
                call, nbytes);
  }
  pthread_mutex_lock(&self->mutex);
  const int inside = find_range(self, address, nbytes) >= 0;
  if (inside) memcpy(dst, src, nbytes);
  pthread_mutex_unlock(&self->mutex);
  if (!inside) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                "%s(device = 0, %s = 0x%" PRIx64 ", nbytes = %" PRIu64
                "): range is not inside a live allocation",
                call, address_name, address, nbytes);
  }
  return DEVALLOC_STATUS_OK;
}

static devalloc_status example_copy_host_to_device(devalloc_instance* self,
                                                   const devalloc_copy_to_device_args* args,
                                                   devalloc_error* error) {
  if (args == NULL || args->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_copy_to_device_args, user_data)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "copy_host_to_device: args NULL or too small");
  }
  devalloc_status status;
  if (self == NULL) {
    status = fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "copy_host_to_device: instance is NULL");
  } else if (args->src_lifetime != DEVALLOC_SRC_DURING_CALL &&
             args->src_lifetime != DEVALLOC_SRC_UNTIL_RELEASED) {
    status = fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "copy_host_to_device(src_lifetime = %" PRIu32 "): unknown src_lifetime", args->src_lifetime);
  } else {
    status = copy_locked(self, "copy_host_to_device", "dst", args->device, args->dst,
                         as_pointer(args->dst), args->src, args->nbytes, error);
  }
  /* The copy has read src (or failed): release it now, exactly once. */
  if (args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED && args->on_release != NULL) {
    args->on_release(args->user_data);
  }
  return status;
}

static devalloc_status example_copy_device_to_host(devalloc_instance* self,
                                                   const devalloc_copy_to_host_args* args,
                                                   devalloc_error* error) {
  if (self == NULL || args == NULL ||
      args->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_copy_to_host_args, nbytes)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "copy_device_to_host: NULL or too small");
  }
  if (args->reserved0 != 0) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "copy_device_to_host: reserved0 is not 0");
  }
  return copy_locked(self, "copy_device_to_host", "src", args->device, args->src, args->dst,
                     as_pointer(args->src), args->nbytes, error);
}

static devalloc_status example_synchronize(devalloc_instance* self, uint32_t device,
                                           devalloc_error* error) {
  if (self == NULL) return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "synchronize: instance is NULL");
  if (device != 0) {
    return fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "synchronize(device = %" PRIu32 "): no such device",
                device);
  }
  return DEVALLOC_STATUS_OK;
}

static const devalloc_plugin_api_v1 example_api = {
    sizeof(devalloc_plugin_api_v1),
    DEVALLOC_ABI_VERSION_MAJOR,
    DEVALLOC_ABI_VERSION_MINOR,
    "example",
    "1.0.0",
    example_create,
    example_destroy,
    example_get_capabilities,
    example_get_device_count,
    example_get_device_properties,
    example_allocate,
    example_deallocate,
    example_copy_host_to_device,
    example_copy_device_to_host,
    example_synchronize,
    NULL, /* allocate_host: no host staging */
    NULL, /* free_host */
    NULL, /* get_memory_info (ABI 1.1, optional) */
    NULL, /* map_to_host (ABI 1.2, optional) */
    NULL, /* unmap_from_host */
};

/* The one exported symbol. This plugin speaks major 1 only. */
DEVALLOC_PLUGIN_EXPORT devalloc_status devalloc_plugin_negotiate(devalloc_negotiation* negotiation,
                                                                 devalloc_error* error) {
  if (negotiation == NULL || negotiation->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api)) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "devalloc_plugin_negotiate: NULL or too small");
  }
  negotiation->plugin_major = DEVALLOC_ABI_VERSION_MAJOR;
  negotiation->plugin_minor = DEVALLOC_ABI_VERSION_MINOR;
  negotiation->plugin_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  negotiation->api = NULL;
  if (negotiation->host_min_major > DEVALLOC_ABI_VERSION_MAJOR ||
      negotiation->host_max_major < DEVALLOC_ABI_VERSION_MAJOR) {
    return fail(error, DEVALLOC_STATUS_UNSUPPORTED,
                "example plugin speaks ABI major %d only; the host speaks %" PRIu32 "..%" PRIu32,
                DEVALLOC_ABI_VERSION_MAJOR, negotiation->host_min_major, negotiation->host_max_major);
  }
  negotiation->api = &example_api;
  return DEVALLOC_STATUS_OK;
}
