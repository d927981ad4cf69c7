/*
 * The plugin zoo: plugins that are broken in one way each, for the loader's
 * tests. Built once per variant with one compile definition:
 *   DEVALLOC_ZOO_NO_ENTRY     exports a function, but not the entry point
 *   DEVALLOC_ZOO_REFUSES      the entry point fails with INTERNAL
 *   DEVALLOC_ZOO_MAJOR2       speaks ABI major 2 only and says so
 *   DEVALLOC_ZOO_LIES_MAJOR2  answers OK with major 2 to a host asking for 1
 *   DEVALLOC_ZOO_SMALL_TABLE  answers OK with a 16-byte function table
 *   DEVALLOC_ZOO_TABLE_MAJOR2 answers OK with major 1, but its function table
 *                             says abi_major 2
 *   DEVALLOC_ZOO_CREATE_FAILS create() finds no vendor runtime
 *   DEVALLOC_ZOO_MISSING_DEP  needs a library the dynamic linker cannot find
 *   DEVALLOC_ZOO_NEGOTIATION_SCRIBBLE
 *                             answers OK with its table, and writes 32 bytes of 0xff
 *                             past the negotiation struct, whatever struct_size it was
 *                             given (PLUGIN-4), as one built against a header whose
 *                             struct grew would
 *   DEVALLOC_ZOO_NULL_NAME    answers OK with a table whose plugin_name is NULL
 *   DEVALLOC_ZOO_EMPTY_NAME   answers OK with a table whose plugin_name is ""
 *   DEVALLOC_ZOO_NEGOTIATE_STATUS42
 *                             the entry point answers status 42, which the ABI does
 *                             not define (PLUGIN-5), with a message
 *   DEVALLOC_ZOO_CREATE_STATUS42
 *                             create() answers status 42 (PLUGIN-5), with a message
 * Every function of a table other than create() answers UNSUPPORTED: the
 * loader must refuse these plugins before it calls any of them.
 *
 * The variants below load and work (one device of host memory; the release
 * of an until-released copy comes at the next synchronize) but break one
 * numbered rule of docs/abi.md each, for the validation layer's tests:
 *   DEVALLOC_ZOO_WELL_BEHAVED       breaks nothing (the control)
 *   DEVALLOC_ZOO_WRITES_PAST_STRUCT PLUGIN-4: get_capabilities writes past struct_size
 *   DEVALLOC_ZOO_UNKNOWN_STATUS     PLUGIN-5: synchronize returns status 42
 *   DEVALLOC_ZOO_NO_MESSAGE         PLUGIN-6: an allocation too large fails without a message
 *   DEVALLOC_ZOO_DESTROY_FORGETS    PLUGIN-9: destroy drops pending releases
 *   DEVALLOC_ZOO_BAD_DEVICE_TYPE    PLUGIN-10: DLPack device type 99
 *   DEVALLOC_ZOO_MISALIGNED         PLUGIN-11: allocate returns base + 1
 *   DEVALLOC_ZOO_MISALIGNED_KEEPS   PLUGIN-11 as MISALIGNED, and deallocate refuses
 *                                   every address (destroy frees all)
 *   DEVALLOC_ZOO_ACCEPTS_BAD_FREE   PLUGIN-12: deallocate accepts any address
 *   DEVALLOC_ZOO_REFUSES_FREE       breaks nothing, but deallocate fails with
 *                                   DEVICE_ERROR for every address (destroy frees all)
 *   DEVALLOC_ZOO_DOUBLE_RELEASE     PLUGIN-14: releases at the copy and again at synchronize
 *   DEVALLOC_ZOO_ACCEPTS_BAD_COPY   PLUGIN-15: a copy outside every allocation "succeeds"
 *   DEVALLOC_ZOO_NEVER_RELEASES     PLUGIN-20: synchronize returns without releasing
 *                                   (destroy still releases)
 *   DEVALLOC_ZOO_FAILED_COPY_UNRELEASED
 *                                   PLUGIN-14: the second until-released copy fails
 *                                   and is never released; nor is a copy it refuses
 *                                   (a range outside every allocation, a device
 *                                   it does not have)
 *   DEVALLOC_ZOO_STRAY_RELEASE      PLUGIN-14: releases each until-released copy
 *                                   with a user_data it was never given, and never
 *                                   with its own (destroy does not either)
 *   DEVALLOC_ZOO_PER_INSTANCE_ADDRESSES
 *                                   PLUGIN-12: every instance numbers its device
 *                                   addresses from the same base, so two instances
 *                                   hand out the same address (as a driver with
 *                                   per-context page tables would)
 *   DEVALLOC_ZOO_SHARED_ADDRESSES   PLUGIN-11/12: every allocation of an instance starts
 *                                   at one address, so a second live allocation overlaps
 *                                   the first (a copy to it lands in the first one)
 *   DEVALLOC_ZOO_TOP_ADDRESSES      breaks nothing by itself: allocation slot i starts at
 *                                   2^64 - (i + 1) MiB whatever its size, so a 1 MiB
 *                                   allocation in slot 0 ends exactly at 2^64; a larger
 *                                   one there runs past it (PLUGIN-11), and one larger
 *                                   than 1 MiB in another slot overlaps the slot below
 *   DEVALLOC_ZOO_MINOR_MISMATCH     PLUGIN-3: the table's abi_minor is 99, the
 *                                   negotiation answers the header's minor
 *   DEVALLOC_ZOO_MUTABLE_TABLE      PLUGIN-3: its table lies in writable memory, and it
 *                                   changes it after the loader read it: create clears
 *                                   copy_host_to_device; allocate clears copy_device_to_host,
 *                                   synchronize and deallocate (a second open in the same
 *                                   process then finds them missing)
 *   DEVALLOC_ZOO_IFUNC_ENTRY        breaks nothing: its devalloc_plugin_negotiate is a GNU
 *                                   indirect function (STT_GNU_IFUNC) whose resolver picks a
 *                                   hidden function, which dlsym returns
 *   DEVALLOC_ZOO_NULL_STAGING       offers HOST_STAGING, and allocate_host answers OK
 *                                   with a NULL pointer (plugin_abi.h: only for 0 bytes)
 *   DEVALLOC_ZOO_HOSTILE_NAMES      breaks nothing, but its version and device name
 *                                   hold terminal escapes and bytes that are not UTF-8,
 *                                   its PCI bus id a terminal escape, and its version
 *                                   is 305 bytes long
 *   DEVALLOC_ZOO_SCRIBBLES_PAST_STRUCTS
 *                                   PLUGIN-4: as a plugin built against a header whose
 *                                   structs grew by 32 bytes, writes 32 bytes of 0xff
 *                                   right after sizeof of the capabilities, the device
 *                                   properties and the allocate args, whatever
 *                                   struct_size it was handed (not after the
 *                                   negotiation struct: the loader refuses a plugin
 *                                   that does, see NEGOTIATION_SCRIBBLE, so the suite
 *                                   could not run on it); its negotiation is right (it
 *                                   refuses a host without major 1)
 *   DEVALLOC_ZOO_NEGOTIATES_TWO_TABLES
 *                                   PLUGIN-3: its first negotiation after the library
 *                                   is loaded hands out its table; every later one a
 *                                   copy named "zoo-b" without synchronize (refuses a
 *                                   host without major 1)
 *   DEVALLOC_ZOO_SLOW_FOURTH_COPY   breaks nothing: as WELL_BEHAVED (releases at the next
 *                                   synchronize, which PLUGIN-20 allows), but its fourth
 *                                   until-released copy call takes 300 ms
 *   DEVALLOC_ZOO_STAGING_16         breaks nothing: offers HOST_STAGING, and allocate_host
 *                                   gives memory aligned to 16 bytes, not to a page (the
 *                                   ABI promises no alignment)
 *   DEVALLOC_ZOO_V1_0_HOST_ADDRESSABLE
 *                                   a 1.0 plugin (negotiates minor 0, a table of 1.0's
 *                                   size) that sets DEVALLOC_CAPABILITY_HOST_ADDRESSABLE,
 *                                   which 1.1 added, though its device addresses are
 *                                   not host pointers (bit 62 flipped)
 *   DEVALLOC_ZOO_ROUND_ROBIN_STAGING
 *                                   PLUGIN-18: offers HOST_STAGING from a pool of 4
 *                                   buffers of 64 KiB per instance, handed out round
 *                                   robin whether or not the host still uses them (the
 *                                   fifth allocate_host gives the first buffer again;
 *                                   free_host keeps them for the pool); its until-released
 *                                   copies read their source only at the next
 *                                   synchronize (then release), as an asynchronous
 *                                   copy engine does
 *   DEVALLOC_ZOO_MAPS_CARELESSLY    PLUGIN-22: offers HOST_MAPPABLE; map_to_host maps
 *                                   a range inside one live allocation (and refuses
 *                                   others), but unmap_from_host accepts any non-NULL
 *                                   pointer, one it never mapped too
 *   DEVALLOC_ZOO_ODD_SRC_ALIGNMENT  PLUGIN-23: its copy_src_alignment is 24, no power
 *                                   of two
 */
#if defined(DEVALLOC_ZOO_SLOW_FOURTH_COPY) || defined(DEVALLOC_ZOO_STAGING_16)
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#endif
#include <devalloc/plugin_abi.h>

#include <stdio.h>
#include <string.h>

#if defined(DEVALLOC_ZOO_NO_ENTRY)

__attribute__((visibility("default"))) int devalloc_zoo_not_the_entry_point(void) {
  return 0;
}

#else

#if defined(DEVALLOC_ZOO_WELL_BEHAVED) || defined(DEVALLOC_ZOO_WRITES_PAST_STRUCT) ||     \
    defined(DEVALLOC_ZOO_UNKNOWN_STATUS) || defined(DEVALLOC_ZOO_NO_MESSAGE) ||          \
    defined(DEVALLOC_ZOO_DESTROY_FORGETS) || defined(DEVALLOC_ZOO_BAD_DEVICE_TYPE) ||    \
    defined(DEVALLOC_ZOO_MISALIGNED) || defined(DEVALLOC_ZOO_ACCEPTS_BAD_FREE) ||        \
    defined(DEVALLOC_ZOO_MISALIGNED_KEEPS) || defined(DEVALLOC_ZOO_REFUSES_FREE) ||       \
    defined(DEVALLOC_ZOO_DOUBLE_RELEASE) || defined(DEVALLOC_ZOO_ACCEPTS_BAD_COPY) ||    \
    defined(DEVALLOC_ZOO_NEVER_RELEASES) || defined(DEVALLOC_ZOO_FAILED_COPY_UNRELEASED) || \
    defined(DEVALLOC_ZOO_STRAY_RELEASE) || defined(DEVALLOC_ZOO_NULL_STAGING) ||          \
    defined(DEVALLOC_ZOO_HOSTILE_NAMES) || defined(DEVALLOC_ZOO_PER_INSTANCE_ADDRESSES) || \
    defined(DEVALLOC_ZOO_SHARED_ADDRESSES) ||                                             \
    defined(DEVALLOC_ZOO_MINOR_MISMATCH) || defined(DEVALLOC_ZOO_TOP_ADDRESSES) ||      \
    defined(DEVALLOC_ZOO_V1_0_HOST_ADDRESSABLE) || defined(DEVALLOC_ZOO_IFUNC_ENTRY) ||  \
    defined(DEVALLOC_ZOO_MUTABLE_TABLE) || defined(DEVALLOC_ZOO_SCRIBBLES_PAST_STRUCTS) ||  \
    defined(DEVALLOC_ZOO_NEGOTIATES_TWO_TABLES) || defined(DEVALLOC_ZOO_SLOW_FOURTH_COPY) || \
    defined(DEVALLOC_ZOO_STAGING_16) || defined(DEVALLOC_ZOO_ROUND_ROBIN_STAGING) ||     \
    defined(DEVALLOC_ZOO_MAPS_CARELESSLY) || defined(DEVALLOC_ZOO_ODD_SRC_ALIGNMENT)
#define DEVALLOC_ZOO_WORKS 1
#endif

#if defined(DEVALLOC_ZOO_ROUND_ROBIN_STAGING)
/* Until-released copies are done by synchronize, not by the copy call. */
#define ZOO_DEFERS_COPIES 1
#define ZOO_POOL_BUFFERS 4
#define ZOO_POOL_BUFFER_BYTES ((uint64_t)64 << 10)
#endif

#if defined(DEVALLOC_ZOO_MUTABLE_TABLE)
#define ZOO_TABLE_CONST
#else
#define ZOO_TABLE_CONST const
#endif
/* Defined below. Not static: the variants that refuse to negotiate never
 * hand it out, and hidden visibility keeps it unexported all the same. */
extern ZOO_TABLE_CONST devalloc_plugin_api_v1 devalloc_zoo_api;

#if defined(DEVALLOC_ZOO_V1_0_HOST_ADDRESSABLE)
#define ZOO_MINOR 0
#define ZOO_TABLE_SIZE DEVALLOC_PLUGIN_API_V1_MIN_SIZE
/* Flipped in every device address: writing through one as a host pointer
 * faults. */
#define ZOO_NOT_HOST_BIT ((uint64_t)1 << 62)
#else
#define ZOO_MINOR DEVALLOC_ABI_VERSION_MINOR
#define ZOO_TABLE_SIZE sizeof(devalloc_plugin_api_v1)
#endif

#if defined(DEVALLOC_ZOO_SCRIBBLES_PAST_STRUCTS)
/* Breaks PLUGIN-4 the way a plugin built against a header with grown structs
 * would: 32 bytes of 0xff after the struct. Byte by byte and out of
 * AddressSanitizer's sight, as a vendor's plugin (built without it) writes:
 * the tests are about what the host makes of such writes, in an ASan build
 * too, where a host's slack is the redzone ASan would otherwise report. */
#if defined(__GNUC__)
__attribute__((no_sanitize_address))
#endif
static void zoo_scribble(void* end) {
  volatile unsigned char* bytes = (volatile unsigned char*)end;
  int i;
  for (i = 0; i < 32; ++i) bytes[i] = 0xff;
}
#define ZOO_SCRIBBLE_PAST(p) zoo_scribble((char*)(p) + sizeof *(p))
#define ZOO_NEGOTIATES_RANGE 1
#else
#define ZOO_SCRIBBLE_PAST(p) ((void)0)
#endif
#if defined(DEVALLOC_ZOO_NEGOTIATES_TWO_TABLES)
#define ZOO_NEGOTIATES_RANGE 1
#endif

#if defined(DEVALLOC_ZOO_HOSTILE_NAMES)
/* 7 + 300 bytes: longer than a message shows, so it ends in its length. */
#define ZOO_VERSION_50 "vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"
#define ZOO_VERSION                                                                      \
  "0\x1b[31m\xff" ZOO_VERSION_50 ZOO_VERSION_50 ZOO_VERSION_50 ZOO_VERSION_50 ZOO_VERSION_50 \
      ZOO_VERSION_50
#define ZOO_DEVICE_NAME "zoo \x1b[2J\xff memory"
#define ZOO_PCI_BUS_ID "0000:\x1b[5m01:00.0"
#else
#define ZOO_VERSION "0"
#define ZOO_DEVICE_NAME "zoo memory"
#endif

static devalloc_status zoo_fail(devalloc_error* error, devalloc_status status,
                                const char* message) {
  if (error != NULL &&
      error->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_error, message)) {
    snprintf(error->message, sizeof error->message, "%s", message);
  }
  return status;
}

#if defined(DEVALLOC_ZOO_MISSING_DEP)
/* Defined in libdevalloc_zoo_dependency.so; calling it keeps that library in
 * DT_NEEDED even when the linker drops unused ones. */
int devalloc_zoo_dependency_answer(void);
#endif

#if !defined(DEVALLOC_ZOO_WORKS)

static devalloc_status zoo_create(devalloc_create_args* args, devalloc_error* error) {
  (void)args;
#if defined(DEVALLOC_ZOO_CREATE_FAILS)
  return zoo_fail(error, DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                  "zoo: vendor runtime libzoo.so.3 not found");
#elif defined(DEVALLOC_ZOO_CREATE_STATUS42)
  return zoo_fail(error, 42, "zoo: create answers a status of its own");
#elif defined(DEVALLOC_ZOO_MISSING_DEP)
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED,
                  devalloc_zoo_dependency_answer() == 42 ? "zoo: unsupported"
                                                         : "zoo: broken dependency");
#else
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
#endif
}

static void zoo_destroy(devalloc_instance* instance) { (void)instance; }

static devalloc_status zoo_get_capabilities(devalloc_instance* instance,
                                            devalloc_capabilities* capabilities,
                                            devalloc_error* error) {
  (void)instance;
  (void)capabilities;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_get_device_count(devalloc_instance* instance, uint32_t* count,
                                            devalloc_error* error) {
  (void)instance;
  (void)count;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_get_device_properties(devalloc_instance* instance,
                                                 uint32_t device,
                                                 devalloc_device_properties* properties,
                                                 devalloc_error* error) {
  (void)instance;
  (void)device;
  (void)properties;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_allocate(devalloc_instance* instance, devalloc_allocate_args* args,
                                    devalloc_error* error) {
  (void)instance;
  (void)args;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_deallocate(devalloc_instance* instance, uint32_t device,
                                      devalloc_device_address address, devalloc_error* error) {
  (void)instance;
  (void)device;
  (void)address;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_copy_host_to_device(devalloc_instance* instance,
                                               const devalloc_copy_to_device_args* args,
                                               devalloc_error* error) {
  (void)instance;
  (void)args;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_copy_device_to_host(devalloc_instance* instance,
                                               const devalloc_copy_to_host_args* args,
                                               devalloc_error* error) {
  (void)instance;
  (void)args;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_synchronize(devalloc_instance* instance, uint32_t device,
                                       devalloc_error* error) {
  (void)instance;
  (void)device;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

#else

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#define ZOO_MAX_ALLOCATIONS 256
#define ZOO_MAX_PENDING 4096
#define ZOO_DEVICE_BYTES ((uint64_t)1 << 30)
#define ZOO_MAX_ALIGNMENT 4096

typedef struct zoo_allocation {
  uint64_t base;       /* the device address handed out */
  uint64_t nbytes;
  void* raw;           /* what malloc returned */
  unsigned char* host; /* where base's bytes are: raw, aligned */
} zoo_allocation;

#if defined(DEVALLOC_ZOO_PER_INSTANCE_ADDRESSES)
/* Allocation slot i of every instance is at this base + i * stride. */
#define ZOO_INSTANCE_BASE ((uint64_t)0x100000000000ULL)
#define ZOO_SLOT_STRIDE ((uint64_t)1 << 31)
#endif
#if defined(DEVALLOC_ZOO_SHARED_ADDRESSES)
/* Every allocation starts here, whatever its slot. */
#define ZOO_SHARED_BASE ((uint64_t)0x100000000000ULL)
#endif
#if defined(DEVALLOC_ZOO_TOP_ADDRESSES)
/* Allocation slot i starts at 2^64 - (i + 1) * this, whatever its size. */
#define ZOO_TOP_SLOT ((uint64_t)1 << 20)
#endif

typedef struct zoo_release {
  devalloc_release_fn fn;
  void* user_data;
#if defined(ZOO_DEFERS_COPIES)
  /* The copy that synchronize does before the release. */
  unsigned char* dst;
  const void* src;
  uint64_t nbytes;
#endif
} zoo_release;

struct devalloc_instance {
  pthread_mutex_t mutex;
  zoo_allocation allocations[ZOO_MAX_ALLOCATIONS];
  zoo_release pending[ZOO_MAX_PENDING];
  size_t pending_count;
  /* Threads firing releases they took out of `pending` (under mutex); a
   * synchronize returns only once none is left (PLUGIN-20), `fired` says
   * when. */
  size_t firing;
  pthread_cond_t fired;
  uint64_t until_released_copies;
#if defined(DEVALLOC_ZOO_ROUND_ROBIN_STAGING)
  unsigned char* pool[ZOO_POOL_BUFFERS]; /* under mutex; freed by destroy */
  size_t pool_next;
#endif
};

#if defined(DEVALLOC_ZOO_STRAY_RELEASE)
/* What the stray releases pass: an address no host gave out. */
static char zoo_stray_user_data[64];
#endif

/* Takes the pending releases out under the lock and calls them outside it,
 * then waits for those other threads took out before: every release of a
 * copy issued before the call has run when it returns (PLUGIN-20). */
static void zoo_fire_pending(devalloc_instance* z) {
  zoo_release fire[ZOO_MAX_PENDING];
  size_t n, i;
  pthread_mutex_lock(&z->mutex);
  n = z->pending_count;
  memcpy(fire, z->pending, n * sizeof fire[0]);
  z->pending_count = 0;
  ++z->firing;
  pthread_mutex_unlock(&z->mutex);
  for (i = 0; i < n; ++i) {
#if defined(ZOO_DEFERS_COPIES)
    if (fire[i].nbytes != 0) memcpy(fire[i].dst, fire[i].src, (size_t)fire[i].nbytes);
#endif
    fire[i].fn(fire[i].user_data);
  }
  pthread_mutex_lock(&z->mutex);
  if (--z->firing == 0) pthread_cond_broadcast(&z->fired);
  while (z->firing != 0) pthread_cond_wait(&z->fired, &z->mutex);
  pthread_mutex_unlock(&z->mutex);
}

static int zoo_inside(devalloc_instance* z, uint64_t address, uint64_t nbytes) {
  size_t i;
  for (i = 0; i < ZOO_MAX_ALLOCATIONS; ++i) {
    const zoo_allocation* a = &z->allocations[i];
    if (a->raw != NULL && address >= a->base && address - a->base < a->nbytes &&
        nbytes <= a->nbytes - (address - a->base)) {
      return 1;
    }
  }
  return 0;
}

/* The host memory behind a device address inside a live allocation (the
 * caller checked with zoo_inside); under the mutex. */
static unsigned char* zoo_host_pointer(devalloc_instance* z, uint64_t address) {
  size_t i;
  for (i = 0; i < ZOO_MAX_ALLOCATIONS; ++i) {
    const zoo_allocation* a = &z->allocations[i];
    if (a->raw != NULL && address >= a->base && address - a->base < a->nbytes) {
      return a->host + (address - a->base);
    }
  }
  return NULL;
}

static devalloc_status zoo_create(devalloc_create_args* args, devalloc_error* error) {
  devalloc_instance* z;
  if (args == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL args");
  if (args->option_count != 0) {
    return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: takes no options");
  }
  z = (devalloc_instance*)calloc(1, sizeof *z);
  if (z == NULL) return zoo_fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "zoo: calloc failed");
  pthread_mutex_init(&z->mutex, NULL);
  pthread_cond_init(&z->fired, NULL);
  args->instance = z;
#if defined(DEVALLOC_ZOO_MUTABLE_TABLE)
  devalloc_zoo_api.copy_host_to_device = NULL;
#endif
  return DEVALLOC_STATUS_OK;
}

static void zoo_destroy(devalloc_instance* z) {
  size_t i;
#if !defined(DEVALLOC_ZOO_DESTROY_FORGETS)
  zoo_fire_pending(z);
#endif
  for (i = 0; i < ZOO_MAX_ALLOCATIONS; ++i) free(z->allocations[i].raw);
#if defined(DEVALLOC_ZOO_ROUND_ROBIN_STAGING)
  for (i = 0; i < ZOO_POOL_BUFFERS; ++i) free(z->pool[i]);
#endif
  pthread_cond_destroy(&z->fired);
  pthread_mutex_destroy(&z->mutex);
  free(z);
}

static devalloc_status zoo_get_capabilities(devalloc_instance* z,
                                            devalloc_capabilities* capabilities,
                                            devalloc_error* error) {
  devalloc_capabilities c;
  (void)z;
  if (capabilities == NULL ||
      capabilities->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_capabilities, max_alignment)) {
    return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: capabilities NULL or too small");
  }
  memset(&c, 0, sizeof c); /* the 1.2 DMA constraints: none */
  c.struct_size = capabilities->struct_size;
  c.flags = DEVALLOC_CAPABILITY_ASYNC_COPY;
#if defined(DEVALLOC_ZOO_MAPS_CARELESSLY)
  c.flags |= DEVALLOC_CAPABILITY_HOST_MAPPABLE;
#endif
#if defined(DEVALLOC_ZOO_ODD_SRC_ALIGNMENT)
  c.copy_src_alignment = 24;
#endif
#if defined(DEVALLOC_ZOO_NULL_STAGING) || defined(DEVALLOC_ZOO_STAGING_16) || \
    defined(DEVALLOC_ZOO_ROUND_ROBIN_STAGING)
  c.flags |= DEVALLOC_CAPABILITY_HOST_STAGING;
#endif
#if defined(DEVALLOC_ZOO_V1_0_HOST_ADDRESSABLE)
  c.flags |= DEVALLOC_CAPABILITY_HOST_ADDRESSABLE;
#endif
  c.max_alignment = ZOO_MAX_ALIGNMENT;
  memcpy(capabilities, &c, sizeof c);
  ZOO_SCRIBBLE_PAST(capabilities);
#if defined(DEVALLOC_ZOO_WRITES_PAST_STRUCT)
  memset((char*)capabilities + capabilities->struct_size, 0xee, 8);
#endif
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_get_device_count(devalloc_instance* z, uint32_t* count,
                                            devalloc_error* error) {
  (void)z;
  if (count == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL count");
  *count = 1;
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_get_device_properties(devalloc_instance* z, uint32_t device,
                                                 devalloc_device_properties* properties,
                                                 devalloc_error* error) {
  devalloc_device_properties p;
  size_t n;
  (void)z;
  if (properties == NULL || properties->struct_size < sizeof(size_t)) {
    return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: properties NULL or too small");
  }
  if (device != 0) return zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only");
  memset(&p, 0, sizeof p);
  p.struct_size = properties->struct_size;
  snprintf(p.name, sizeof p.name, "%s", ZOO_DEVICE_NAME);
#if defined(ZOO_PCI_BUS_ID)
  snprintf(p.pci_bus_id, sizeof p.pci_bus_id, "%s", ZOO_PCI_BUS_ID);
#endif
  p.total_memory_bytes = ZOO_DEVICE_BYTES;
#if defined(DEVALLOC_ZOO_BAD_DEVICE_TYPE)
  p.dlpack_device_type = 99;
#else
  p.dlpack_device_type = DEVALLOC_DLPACK_CPU;
#endif
  n = properties->struct_size < sizeof p ? properties->struct_size : sizeof p;
  memcpy(properties, &p, n);
  ZOO_SCRIBBLE_PAST(properties);
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_allocate(devalloc_instance* z, devalloc_allocate_args* args,
                                    devalloc_error* error) {
  uint64_t alignment;
  size_t i;
  void* raw;
  if (args == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL args");
  if (args->device != 0) return zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only");
#if defined(DEVALLOC_ZOO_MUTABLE_TABLE)
  devalloc_zoo_api.copy_device_to_host = NULL;
  devalloc_zoo_api.synchronize = NULL;
  devalloc_zoo_api.deallocate = NULL;
#endif
  alignment = args->alignment == 0 ? 256 : args->alignment;
  if ((alignment & (alignment - 1)) != 0) {
    return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: alignment not a power of two");
  }
  if (alignment > ZOO_MAX_ALIGNMENT) {
    return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: alignment above 4096");
  }
  if (args->nbytes == 0) {
    args->address = 0;
    return DEVALLOC_STATUS_OK;
  }
  if (args->nbytes > ZOO_DEVICE_BYTES) {
#if defined(DEVALLOC_ZOO_NO_MESSAGE)
    return DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY;
#else
    return zoo_fail(error, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "zoo: larger than the device");
#endif
  }
  raw = malloc((size_t)(args->nbytes + alignment + 1));
  if (raw == NULL) return zoo_fail(error, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "zoo: malloc failed");
  pthread_mutex_lock(&z->mutex);
  for (i = 0; i < ZOO_MAX_ALLOCATIONS && z->allocations[i].raw != NULL; ++i) {
  }
  if (i == ZOO_MAX_ALLOCATIONS) {
    pthread_mutex_unlock(&z->mutex);
    free(raw);
    return zoo_fail(error, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "zoo: too many allocations");
  }
  z->allocations[i].raw = raw;
  z->allocations[i].nbytes = args->nbytes;
  z->allocations[i].base = ((uint64_t)(uintptr_t)raw + alignment - 1) & ~(alignment - 1);
#if defined(DEVALLOC_ZOO_MISALIGNED) || defined(DEVALLOC_ZOO_MISALIGNED_KEEPS)
  z->allocations[i].base += 1;
#endif
  z->allocations[i].host = (unsigned char*)(uintptr_t)z->allocations[i].base;
#if defined(DEVALLOC_ZOO_PER_INSTANCE_ADDRESSES)
  z->allocations[i].base = ZOO_INSTANCE_BASE + (uint64_t)i * ZOO_SLOT_STRIDE;
#endif
#if defined(DEVALLOC_ZOO_SHARED_ADDRESSES)
  z->allocations[i].base = ZOO_SHARED_BASE;
#endif
#if defined(DEVALLOC_ZOO_TOP_ADDRESSES)
  z->allocations[i].base = (uint64_t)0 - ((uint64_t)i + 1) * ZOO_TOP_SLOT;
#endif
#if defined(ZOO_NOT_HOST_BIT)
  z->allocations[i].base ^= ZOO_NOT_HOST_BIT;
#endif
  args->address = z->allocations[i].base;
  pthread_mutex_unlock(&z->mutex);
  ZOO_SCRIBBLE_PAST(args);
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_deallocate(devalloc_instance* z, uint32_t device,
                                      devalloc_device_address address, devalloc_error* error) {
  size_t i;
  void* raw = NULL;
  if (device != 0) return zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only");
  if (address == 0) return DEVALLOC_STATUS_OK;
#if defined(DEVALLOC_ZOO_MISALIGNED_KEEPS) || defined(DEVALLOC_ZOO_REFUSES_FREE)
  (void)z;
  (void)i;
  (void)raw;
  return zoo_fail(error, DEVALLOC_STATUS_DEVICE_ERROR, "zoo: deallocate refuses every address");
#else
  pthread_mutex_lock(&z->mutex);
  for (i = 0; i < ZOO_MAX_ALLOCATIONS; ++i) {
    if (z->allocations[i].raw != NULL && z->allocations[i].base == address) {
      raw = z->allocations[i].raw;
      z->allocations[i].raw = NULL;
      break;
    }
  }
  pthread_mutex_unlock(&z->mutex);
  free(raw);
#if defined(DEVALLOC_ZOO_ACCEPTS_BAD_FREE)
  return DEVALLOC_STATUS_OK;
#else
  return raw != NULL ? DEVALLOC_STATUS_OK
                     : zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: unknown address");
#endif
#endif
}

static devalloc_status zoo_copy_host_to_device(devalloc_instance* z,
                                               const devalloc_copy_to_device_args* args,
                                               devalloc_error* error) {
  int releases, inside;
  if (args == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL args");
  releases = args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED && args->on_release != NULL;
  pthread_mutex_lock(&z->mutex);
  inside = args->nbytes == 0 || (args->src != NULL && zoo_inside(z, args->dst, args->nbytes));
  pthread_mutex_unlock(&z->mutex);
  if (args->device != 0 || !inside) {
#if defined(DEVALLOC_ZOO_ACCEPTS_BAD_COPY)
    if (args->device == 0) {
      if (releases) args->on_release(args->user_data);
      return DEVALLOC_STATUS_OK; /* and copies nothing */
    }
#endif
#if !defined(DEVALLOC_ZOO_FAILED_COPY_UNRELEASED)
    if (releases) args->on_release(args->user_data);
#endif
    return args->device != 0
               ? zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only")
               : zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: range outside every allocation");
  }
#if defined(DEVALLOC_ZOO_FAILED_COPY_UNRELEASED)
  if (releases && args->nbytes != 0) {
    uint64_t n;
    pthread_mutex_lock(&z->mutex);
    n = ++z->until_released_copies;
    pthread_mutex_unlock(&z->mutex);
    if (n == 2) return zoo_fail(error, DEVALLOC_STATUS_DEVICE_ERROR, "zoo: copy 2 fails");
  }
#endif
#if defined(DEVALLOC_ZOO_SLOW_FOURTH_COPY)
  if (releases && args->nbytes != 0) {
    uint64_t n;
    pthread_mutex_lock(&z->mutex);
    n = ++z->until_released_copies;
    pthread_mutex_unlock(&z->mutex);
    if (n == 4) {
      struct timespec pause = {0, 300000000L};
      nanosleep(&pause, NULL);
    }
  }
#endif
#if defined(ZOO_DEFERS_COPIES)
  if (releases && args->nbytes != 0) {
    pthread_mutex_lock(&z->mutex);
    if (z->pending_count < ZOO_MAX_PENDING) {
      z->pending[z->pending_count].fn = args->on_release;
      z->pending[z->pending_count].user_data = args->user_data;
      z->pending[z->pending_count].dst = zoo_host_pointer(z, args->dst);
      z->pending[z->pending_count].src = args->src;
      z->pending[z->pending_count].nbytes = args->nbytes;
      ++z->pending_count;
      pthread_mutex_unlock(&z->mutex);
      return DEVALLOC_STATUS_OK;
    }
    pthread_mutex_unlock(&z->mutex);
  }
#endif
  if (args->nbytes != 0) {
    unsigned char* dst;
    pthread_mutex_lock(&z->mutex);
    dst = zoo_host_pointer(z, args->dst);
    pthread_mutex_unlock(&z->mutex);
    memcpy(dst, args->src, (size_t)args->nbytes);
  }
  if (!releases) return DEVALLOC_STATUS_OK;
#if defined(DEVALLOC_ZOO_STRAY_RELEASE)
  args->on_release(zoo_stray_user_data);
  return DEVALLOC_STATUS_OK;
#endif
#if defined(DEVALLOC_ZOO_DOUBLE_RELEASE)
  args->on_release(args->user_data);
#endif
  pthread_mutex_lock(&z->mutex);
  if (z->pending_count == ZOO_MAX_PENDING) {
    pthread_mutex_unlock(&z->mutex);
    args->on_release(args->user_data);
    return DEVALLOC_STATUS_OK;
  }
  z->pending[z->pending_count].fn = args->on_release;
  z->pending[z->pending_count].user_data = args->user_data;
#if defined(ZOO_DEFERS_COPIES)
  z->pending[z->pending_count].nbytes = 0; /* copied already */
#endif
  ++z->pending_count;
  pthread_mutex_unlock(&z->mutex);
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_copy_device_to_host(devalloc_instance* z,
                                               const devalloc_copy_to_host_args* args,
                                               devalloc_error* error) {
  int inside;
  if (args == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL args");
  if (args->device != 0) return zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only");
  pthread_mutex_lock(&z->mutex);
  inside = args->nbytes == 0 || (args->dst != NULL && zoo_inside(z, args->src, args->nbytes));
  pthread_mutex_unlock(&z->mutex);
  if (!inside) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: range outside every allocation");
  if (args->nbytes != 0) {
    const unsigned char* src;
    pthread_mutex_lock(&z->mutex);
    src = zoo_host_pointer(z, args->src);
    pthread_mutex_unlock(&z->mutex);
    memcpy(args->dst, src, (size_t)args->nbytes);
  }
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_synchronize(devalloc_instance* z, uint32_t device,
                                       devalloc_error* error) {
  if (device != 0) return zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only");
#if defined(DEVALLOC_ZOO_NEVER_RELEASES)
  (void)z;
#else
  zoo_fire_pending(z);
#endif
#if defined(DEVALLOC_ZOO_UNKNOWN_STATUS)
  return 42;
#else
  return DEVALLOC_STATUS_OK;
#endif
}


#if defined(DEVALLOC_ZOO_NULL_STAGING)
static devalloc_status zoo_allocate_host(devalloc_instance* z, uint64_t nbytes, void** host,
                                         devalloc_error* error) {
  (void)z;
  (void)nbytes;
  if (host == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL host");
  *host = NULL;
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_free_host(devalloc_instance* z, void* host, devalloc_error* error) {
  (void)z;
  (void)host;
  (void)error;
  return DEVALLOC_STATUS_OK;
}
#define ZOO_ALLOCATE_HOST zoo_allocate_host
#define ZOO_FREE_HOST zoo_free_host
#endif

#if defined(DEVALLOC_ZOO_STAGING_16)
/* 16 bytes past a page boundary: aligned to 16, never to 4096. */
static devalloc_status zoo_allocate_host(devalloc_instance* z, uint64_t nbytes, void** host,
                                         devalloc_error* error) {
  void* raw = NULL;
  (void)z;
  if (host == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL host");
  if (nbytes == 0) {
    *host = NULL;
    return DEVALLOC_STATUS_OK;
  }
  if (posix_memalign(&raw, 4096, (size_t)nbytes + 16) != 0) {
    return zoo_fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "zoo: no host memory");
  }
  *host = (unsigned char*)raw + 16;
  return DEVALLOC_STATUS_OK;
}

static devalloc_status zoo_free_host(devalloc_instance* z, void* host, devalloc_error* error) {
  (void)z;
  (void)error;
  if (host != NULL) free((unsigned char*)host - 16);
  return DEVALLOC_STATUS_OK;
}
#define ZOO_ALLOCATE_HOST zoo_allocate_host
#define ZOO_FREE_HOST zoo_free_host
#endif

#if defined(DEVALLOC_ZOO_ROUND_ROBIN_STAGING)
/* The pool's next buffer, in use by the host or not. */
static devalloc_status zoo_allocate_host(devalloc_instance* z, uint64_t nbytes, void** host,
                                         devalloc_error* error) {
  unsigned char** buffer;
  if (host == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL host");
  if (nbytes == 0) {
    *host = NULL;
    return DEVALLOC_STATUS_OK;
  }
  if (nbytes > ZOO_POOL_BUFFER_BYTES) {
    return zoo_fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "zoo: above the pool's 64 KiB");
  }
  pthread_mutex_lock(&z->mutex);
  buffer = &z->pool[z->pool_next++ % ZOO_POOL_BUFFERS];
  if (*buffer == NULL) *buffer = (unsigned char*)malloc((size_t)ZOO_POOL_BUFFER_BYTES);
  *host = *buffer;
  pthread_mutex_unlock(&z->mutex);
  if (*host == NULL) return zoo_fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "zoo: malloc failed");
  return DEVALLOC_STATUS_OK;
}

/* Kept for the pool; destroy frees it. */
static devalloc_status zoo_free_host(devalloc_instance* z, void* host, devalloc_error* error) {
  (void)z;
  (void)host;
  (void)error;
  return DEVALLOC_STATUS_OK;
}
#define ZOO_ALLOCATE_HOST zoo_allocate_host
#define ZOO_FREE_HOST zoo_free_host
#endif

#endif

#if defined(DEVALLOC_ZOO_MAPS_CARELESSLY)
static devalloc_status zoo_map_to_host(devalloc_instance* z, devalloc_map_args* args,
                                       devalloc_error* error) {
  if (args == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL args");
  if (args->device != 0) return zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only");
  args->host = NULL;
  pthread_mutex_lock(&z->mutex);
  if (args->nbytes != 0 && zoo_inside(z, args->address, args->nbytes)) {
    args->host = zoo_host_pointer(z, args->address);
  }
  pthread_mutex_unlock(&z->mutex);
  if (args->host == NULL) {
    return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: range outside every allocation");
  }
  return DEVALLOC_STATUS_OK;
}

/* The breach: nothing is looked up. */
static devalloc_status zoo_unmap_from_host(devalloc_instance* z, uint32_t device, void* host,
                                           devalloc_error* error) {
  (void)z;
  if (device != 0) return zoo_fail(error, DEVALLOC_STATUS_NO_SUCH_DEVICE, "zoo: one device only");
  if (host == NULL) return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT, "zoo: NULL host");
  return DEVALLOC_STATUS_OK;
}
#define ZOO_MAP_TO_HOST zoo_map_to_host
#define ZOO_UNMAP_FROM_HOST zoo_unmap_from_host
#else
#define ZOO_MAP_TO_HOST NULL
#define ZOO_UNMAP_FROM_HOST NULL
#endif

#if !defined(ZOO_ALLOCATE_HOST)
#define ZOO_ALLOCATE_HOST NULL
#define ZOO_FREE_HOST NULL
#endif

ZOO_TABLE_CONST devalloc_plugin_api_v1 devalloc_zoo_api = {
#if defined(DEVALLOC_ZOO_SMALL_TABLE)
    16,
#else
    ZOO_TABLE_SIZE,
#endif
#if defined(DEVALLOC_ZOO_TABLE_MAJOR2)
    2,
#else
    DEVALLOC_ABI_VERSION_MAJOR,
#endif
#if defined(DEVALLOC_ZOO_MINOR_MISMATCH)
    99,
#else
    ZOO_MINOR,
#endif
#if defined(DEVALLOC_ZOO_NULL_NAME)
    NULL,
#elif defined(DEVALLOC_ZOO_EMPTY_NAME)
    "",
#else
    "zoo",
#endif
    ZOO_VERSION,
    zoo_create,
    zoo_destroy,
    zoo_get_capabilities,
    zoo_get_device_count,
    zoo_get_device_properties,
    zoo_allocate,
    zoo_deallocate,
    zoo_copy_host_to_device,
    zoo_copy_device_to_host,
    zoo_synchronize,
    ZOO_ALLOCATE_HOST,
    ZOO_FREE_HOST,
    NULL, /* get_memory_info */
    ZOO_MAP_TO_HOST,
    ZOO_UNMAP_FROM_HOST,
};

#if defined(DEVALLOC_ZOO_IFUNC_ENTRY)
/* The entry point's code, picked by the resolver below. */
static devalloc_status zoo_negotiate(devalloc_negotiation* negotiation, devalloc_error* error);
#define ZOO_NEGOTIATE zoo_negotiate
#else
#define ZOO_NEGOTIATE devalloc_plugin_negotiate
#endif

devalloc_status ZOO_NEGOTIATE(devalloc_negotiation* negotiation, devalloc_error* error) {
  if (negotiation == NULL ||
      negotiation->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api)) {
    return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                    "zoo: negotiation struct is NULL or too small");
  }
  negotiation->plugin_major = DEVALLOC_ABI_VERSION_MAJOR;
  negotiation->plugin_minor = ZOO_MINOR;
  negotiation->plugin_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  negotiation->api = NULL;
#if defined(ZOO_NEGOTIATES_RANGE)
  /* PLUGIN-2, for the variants the whole Negotiation group runs on. */
  if (negotiation->host_min_major > DEVALLOC_ABI_VERSION_MAJOR ||
      negotiation->host_max_major < DEVALLOC_ABI_VERSION_MAJOR) {
    return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: speaks ABI major 1 only");
  }
#endif
#if defined(DEVALLOC_ZOO_REFUSES)
  return zoo_fail(error, DEVALLOC_STATUS_INTERNAL, "zoo: refusing to negotiate");
#elif defined(DEVALLOC_ZOO_NEGOTIATE_STATUS42)
  return zoo_fail(error, 42, "zoo: negotiation answers a status of its own");
#elif defined(DEVALLOC_ZOO_MAJOR2)
  negotiation->plugin_major = 2;
  negotiation->plugin_minor = 0;
  negotiation->plugin_min_major = 2;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: speaks ABI major 2 only");
#elif defined(DEVALLOC_ZOO_LIES_MAJOR2)
  negotiation->plugin_major = 2;
  negotiation->plugin_minor = 0;
  negotiation->plugin_min_major = 2;
  negotiation->api = &devalloc_zoo_api;
  return DEVALLOC_STATUS_OK;
#elif defined(DEVALLOC_ZOO_NEGOTIATION_SCRIBBLE)
  negotiation->api = &devalloc_zoo_api;
  memset((char*)negotiation + sizeof *negotiation, 0xff, 32);
  return DEVALLOC_STATUS_OK;
#elif defined(DEVALLOC_ZOO_NEGOTIATES_TWO_TABLES)
  {
    /* Not thread-safe; the tests negotiate from one thread. */
    static int negotiations;
    static devalloc_plugin_api_v1 second;
    if (negotiations++ == 0) {
      negotiation->api = &devalloc_zoo_api;
    } else {
      second = devalloc_zoo_api;
      second.plugin_name = "zoo-b";
      second.synchronize = NULL;
      negotiation->api = &second;
    }
  }
  return DEVALLOC_STATUS_OK;
#else
  negotiation->api = &devalloc_zoo_api;
  return DEVALLOC_STATUS_OK;
#endif
}

#if defined(DEVALLOC_ZOO_IFUNC_ENTRY)
static devalloc_plugin_negotiate_fn zoo_resolve_negotiate(void) { return zoo_negotiate; }
devalloc_status devalloc_plugin_negotiate(devalloc_negotiation* negotiation, devalloc_error* error)
    __attribute__((ifunc("zoo_resolve_negotiate")));
#endif

#endif
