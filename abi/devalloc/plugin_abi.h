/*
 * devalloc plugin ABI — the one header a vendor implements.
 *
 * Clean C (C89 to C17, -Wall -Wextra -Wpedantic) and C++ (C++11 to C++20,
 * also -Wold-style-cast -Wzero-as-null-pointer-constant); includes only
 * <stddef.h> and <stdint.h>. The ABI is defined for LP64 targets only (see
 * TARGETS at the end): elsewhere the header does not compile.
 *
 * VERSIONING
 *   The ABI has a major and a minor version.
 *   - A minor bump only appends: new fields at the end of structs, new
 *     function pointers at the end of devalloc_plugin_api_v1. Every struct
 *     starts with `struct_size`; a reader never touches a field that lies
 *     beyond the struct_size it was given. A missing (beyond struct_size) or
 *     NULL optional function means "not supported".
 *   - A major bump may change anything. Across a major mismatch only
 *     `struct_size` and the version fields of devalloc_negotiation may be
 *     read; nothing else is safe.
 *   The host and the plugin agree on a major version in
 *   devalloc_plugin_negotiate(), the single symbol a plugin exports.
 *
 * CONVENTIONS
 *   [in]        read by the callee; [out] written by the callee;
 *   [optional]  may be NULL (or 0).
 *   Every function returns a devalloc_status. On failure (status != OK) the
 *   callee writes a human-readable, NUL-terminated message into the
 *   caller-owned devalloc_error, if one was passed. The message names the
 *   vendor call and its arguments, for example
 *     "cuMemAlloc_v2(bytesize = 4096) failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
 *   The caller owns the devalloc_error and its text; it lives as long as the
 *   caller keeps it. On success the callee leaves it untouched.
 *   No C++ exception, longjmp or signal ever crosses this boundary.
 *
 * THREADING
 *   Every function is thread-safe, also for concurrent calls on one device,
 *   except destroy(), which must not race with any other call on the same
 *   instance. Callbacks (on_release) may run on any thread; see
 *   devalloc_release_fn for what they may do.
 *
 * The normative rules, numbered PLUGIN-1 ..., are in docs/abi.md.
 */
#ifndef DEVALLOC_PLUGIN_ABI_H
#define DEVALLOC_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DEVALLOC_ABI_VERSION_MAJOR 1
#define DEVALLOC_ABI_VERSION_MINOR 2

/* The one symbol a plugin exports; the loader looks it up by this name. */
#define DEVALLOC_PLUGIN_ENTRY_POINT_NAME "devalloc_plugin_negotiate"

#if defined(_WIN32)
#define DEVALLOC_PLUGIN_EXPORT __declspec(dllexport)
#else
#define DEVALLOC_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* For this header's own macros: a cast, and a null pointer of a type, as
 * the including language spells them without a warning (C++ compilers warn
 * about C's (type)value and (type*)0). Not part of the ABI. */
#if defined(__cplusplus)
#define DEVALLOC_CAST_(type, value) (static_cast<type>(value))
#if __cplusplus >= 201103L
#define DEVALLOC_NULL_OF_(type) (static_cast<type*>(nullptr))
#else
#define DEVALLOC_NULL_OF_(type) (static_cast<type*>(0))
#endif
#else
#define DEVALLOC_CAST_(type, value) ((type)(value))
#define DEVALLOC_NULL_OF_(type) ((type*)0)
#endif

/* Size of a struct up to and including `last_field`: what a reader compiled
 * against an older minor version requires at least. A constant expression
 * of type size_t. */
#define DEVALLOC_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(DEVALLOC_NULL_OF_(type)->last_field))

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

/* Fixed width; closed set for major version 1. A host that receives a value
 * it does not know treats it as DEVALLOC_STATUS_INTERNAL. */
typedef int32_t devalloc_status;

#define DEVALLOC_STATUS_OK 0
/* An argument is NULL, out of range, misaligned or otherwise malformed. */
#define DEVALLOC_STATUS_INVALID_ARGUMENT 1
/* The device cannot satisfy an allocation of this size. */
#define DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY 2
/* The host cannot satisfy an allocation (staging, bookkeeping). */
#define DEVALLOC_STATUS_OUT_OF_HOST_MEMORY 3
/* The device index is not below the device count. */
#define DEVALLOC_STATUS_NO_SUCH_DEVICE 4
/* The vendor runtime library is missing, too old, or failed to initialize. */
#define DEVALLOC_STATUS_RUNTIME_UNAVAILABLE 5
/* The operation, option or ABI version is not supported by this plugin. */
#define DEVALLOC_STATUS_UNSUPPORTED 6
/* The device or its runtime reported an error while doing the work. */
#define DEVALLOC_STATUS_DEVICE_ERROR 7
/* A bug or broken invariant inside the plugin. */
#define DEVALLOC_STATUS_INTERNAL 8

#define DEVALLOC_ERROR_MESSAGE_CAPACITY 1024

/* Caller-owned failure message. The callee writes at most
 * DEVALLOC_ERROR_MESSAGE_CAPACITY bytes including the terminating NUL,
 * truncating longer text. */
typedef struct devalloc_error {
  size_t struct_size;                             /* [in] sizeof(devalloc_error) */
  char message[DEVALLOC_ERROR_MESSAGE_CAPACITY];  /* [out] NUL-terminated */
} devalloc_error;

/* ------------------------------------------------------------------------ */
/* Plugin instance and options                                               */
/* ------------------------------------------------------------------------ */

/* Opaque; defined by the plugin. */
typedef struct devalloc_instance devalloc_instance;

/* Device memory address as an integer: base + k (k < nbytes) is a valid copy
 * destination. 0 is never a live allocation of a non-zero size. */
typedef uint64_t devalloc_device_address;

typedef struct devalloc_create_args {
  size_t struct_size;              /* [in] */
  /* Options from the runtime config: option_count key/value pairs of
   * NUL-terminated strings, valid during the call only. A plugin rejects a
   * key it does not know with DEVALLOC_STATUS_INVALID_ARGUMENT. */
  const char* const* option_keys;   /* [in][optional when option_count == 0] */
  const char* const* option_values; /* [in][optional when option_count == 0] */
  size_t option_count;              /* [in] */
  devalloc_instance* instance;      /* [out] valid until destroy() */
} devalloc_create_args;

/* ------------------------------------------------------------------------ */
/* Capabilities and devices                                                  */
/* ------------------------------------------------------------------------ */

/* Copies with DEVALLOC_SRC_UNTIL_RELEASED may still be in flight when
 * copy_host_to_device returns. */
#define DEVALLOC_CAPABILITY_ASYNC_COPY (DEVALLOC_CAST_(uint64_t, 1) << 0)
/* allocate_host / free_host are provided and return DMA-friendly memory
 * (pinned, page-locked) from which copies run at full speed. */
#define DEVALLOC_CAPABILITY_HOST_STAGING (DEVALLOC_CAST_(uint64_t, 1) << 1)
/* (ABI 1.1) Device addresses from allocate() are host pointers: the host may
 * write and read the bytes at (void*)(uintptr_t)address directly while no
 * copy into that range is in flight (issued and not yet covered by a
 * synchronize of the device). A 1.0 plugin never sets it. */
#define DEVALLOC_CAPABILITY_HOST_ADDRESSABLE (DEVALLOC_CAST_(uint64_t, 1) << 2)

/* (ABI 1.2) map_to_host / unmap_from_host are provided: the host may read
 * file bytes straight into device memory through a mapping (PLUGIN-22).
 * A plugin below 1.2 never sets it. */
#define DEVALLOC_CAPABILITY_HOST_MAPPABLE (DEVALLOC_CAST_(uint64_t, 1) << 3)

typedef struct devalloc_capabilities {
  size_t struct_size;      /* [in] size the caller knows */
  uint64_t flags;          /* [out] DEVALLOC_CAPABILITY_* */
  uint64_t max_alignment;  /* [out] largest alignment allocate() honours */
  /* ---- ABI 1.2: DMA constraints of copy_host_to_device (PLUGIN-23). Each
   * is a preference the host honours when it cuts and places its copies;
   * a copy that does not meet it is still accepted (and may be slower: the
   * plugin bounces it through memory of its own). 0 means "none". Written
   * only when struct_size covers them (DEVALLOC_CAPABILITIES_V1_2_SIZE). */
  uint64_t copy_src_alignment;   /* [out] power of two, or 0: src of a copy
                                  * aligned to it is read in place */
  uint64_t copy_preferred_bytes; /* [out] copies of a multiple of this size
                                  * run best (a DMA descriptor's size) */
  uint64_t copy_max_bytes;       /* [out] the largest copy the plugin issues
                                  * as one transfer; larger ones are split */
} devalloc_capabilities;

/* What a 1.1 host passes, and what a 1.2 capabilities struct holds. */
#define DEVALLOC_CAPABILITIES_V1_1_SIZE \
  DEVALLOC_STRUCT_SIZE(devalloc_capabilities, max_alignment)
#define DEVALLOC_CAPABILITIES_V1_2_SIZE \
  DEVALLOC_STRUCT_SIZE(devalloc_capabilities, copy_max_bytes)

/* DLPack device type codes, every code of DLPack 1.x (DLDeviceType in
 * dlpack.h; 5 and 6 are unused there). A plugin reports one of these. */
#define DEVALLOC_DLPACK_CPU 1
#define DEVALLOC_DLPACK_CUDA 2
#define DEVALLOC_DLPACK_CUDA_HOST 3
#define DEVALLOC_DLPACK_OPENCL 4
#define DEVALLOC_DLPACK_VULKAN 7
#define DEVALLOC_DLPACK_METAL 8
#define DEVALLOC_DLPACK_VPI 9
#define DEVALLOC_DLPACK_ROCM 10
#define DEVALLOC_DLPACK_ROCM_HOST 11
#define DEVALLOC_DLPACK_EXT_DEV 12
#define DEVALLOC_DLPACK_CUDA_MANAGED 13
#define DEVALLOC_DLPACK_ONEAPI 14
#define DEVALLOC_DLPACK_WEBGPU 15
#define DEVALLOC_DLPACK_HEXAGON 16
#define DEVALLOC_DLPACK_MAIA 17
#define DEVALLOC_DLPACK_TRAINIUM 18

/* 1 when code (any integer) is one of the DEVALLOC_DLPACK_* codes above, else
 * 0. A macro, so that it stays a constant expression in C89: it evaluates
 * `code` up to four times. Pass a plain value (a variable, a field), not an
 * expression with side effects such as next_code() or codes[i++]. */
#define DEVALLOC_DLPACK_IS_KNOWN(code)                          \
  (((code) >= DEVALLOC_DLPACK_CPU && (code) <= DEVALLOC_DLPACK_OPENCL) || \
   ((code) >= DEVALLOC_DLPACK_VULKAN && (code) <= DEVALLOC_DLPACK_TRAINIUM))

#define DEVALLOC_DEVICE_NAME_CAPACITY 256
#define DEVALLOC_PCI_BUS_ID_CAPACITY 32
#define DEVALLOC_MEMORY_KIND_CAPACITY 32

/* A device is one memory the plugin allocates from. A card with several
 * memories (HBM and on-chip SRAM, say) reports each as a device of its own
 * (PLUGIN-24): all of them carry the card's uuid, pci_bus_id and
 * dlpack_device_id, and memory_kind (ABI 1.2) tells them apart. */
typedef struct devalloc_device_properties {
  size_t struct_size;                         /* [in] size the caller knows */
  char name[DEVALLOC_DEVICE_NAME_CAPACITY];   /* [out] NUL-terminated */
  uint64_t total_memory_bytes;                /* [out] */
  uint8_t uuid[16];                           /* [out] all zero if unknown */
  /* "DDDD:BB:DD.F" (domain:bus:device.function), lower-case hex, or "" when
   * the device has none. */
  char pci_bus_id[DEVALLOC_PCI_BUS_ID_CAPACITY]; /* [out] NUL-terminated */
  int32_t dlpack_device_type;                 /* [out] DEVALLOC_DLPACK_* */
  int32_t dlpack_device_id;                   /* [out] DLPack device_id */
  /* ---- ABI 1.2, written only when struct_size covers it. A short
   * lower-case name of this memory on its card ("hbm", "sram"), or "" for
   * a card with one memory. NUL-terminated. */
  char memory_kind[DEVALLOC_MEMORY_KIND_CAPACITY]; /* [out] */
} devalloc_device_properties;

#define DEVALLOC_DEVICE_PROPERTIES_V1_1_SIZE \
  DEVALLOC_STRUCT_SIZE(devalloc_device_properties, dlpack_device_id)
#define DEVALLOC_DEVICE_PROPERTIES_V1_2_SIZE \
  DEVALLOC_STRUCT_SIZE(devalloc_device_properties, memory_kind)

/* ------------------------------------------------------------------------ */
/* Memory and copies                                                         */
/* ------------------------------------------------------------------------ */

typedef struct devalloc_allocate_args {
  size_t struct_size;              /* [in] */
  uint32_t device;                 /* [in] index below the device count */
  uint32_t reserved0;              /* [in] must be 0 */
  uint64_t nbytes;                 /* [in] may be 0 */
  /* [in] power of two; 0 means the plugin's natural alignment (at least 256
   * bytes). Above max_alignment: DEVALLOC_STATUS_UNSUPPORTED. */
  uint64_t alignment;
  devalloc_device_address address; /* [out] 0 when nbytes == 0 */
} devalloc_allocate_args;

/* How long the host source of a copy stays readable and unchanged. */
typedef uint32_t devalloc_src_lifetime;
/* The caller may overwrite or free src as soon as the call returns. */
#define DEVALLOC_SRC_DURING_CALL 0u
/* The caller keeps src readable and unchanged until the plugin calls
 * on_release(user_data). */
#define DEVALLOC_SRC_UNTIL_RELEASED 1u

/* Called exactly once per copy_host_to_device() call that had
 * src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED and a non-NULL on_release:
 * after a successful copy has read src, after a failed one, or at destroy()
 * (PLUGIN-14). May run before or after the copy call returns.
 *
 * An on_release must not call into the plugin, and the plugin must not hold
 * a lock the host could need while calling it; it may be called on any
 * thread, including inside the copy call or inside synchronize.
 *
 * PLUGIN-20 Forward progress. A plugin may defer an on_release until the
 * host calls synchronize on that device, but no later: when
 * synchronize(device) returns, every release for copies issued to that
 * device before it has run. Plugins SHOULD release as soon as the copy has
 * read src, without further host calls. The host never blocks waiting for
 * a release without calling synchronize on the device it waits for.
 *
 * PLUGIN-21 Release accounting. A second on_release for the same copy, or a
 * release still missing after synchronize returned (plus the host's release
 * timeout), is a breach: the host ends its work with an error naming the
 * plugin, the rule and the copy, never a hang or a corrupted budget. The
 * source of a copy whose release never came is kept alive (leaked), never
 * freed under a copy that may still read it. */
typedef void (*devalloc_release_fn)(void* user_data);

typedef struct devalloc_copy_to_device_args {
  size_t struct_size;               /* [in] */
  uint32_t device;                  /* [in] */
  devalloc_src_lifetime src_lifetime; /* [in] DEVALLOC_SRC_* */
  devalloc_device_address dst;      /* [in] inside a live allocation of device */
  const void* src;                  /* [in] host memory, nbytes readable */
  uint64_t nbytes;                  /* [in] 0 is a no-op (dst, src unchecked) */
  devalloc_release_fn on_release;   /* [in][optional] see devalloc_release_fn */
  void* user_data;                  /* [in][optional] passed to on_release as
                                     * given; opaque: it need not be a valid
                                     * pointer and is never dereferenced */
} devalloc_copy_to_device_args;

typedef struct devalloc_copy_to_host_args {
  size_t struct_size;               /* [in] */
  uint32_t device;                  /* [in] */
  uint32_t reserved0;               /* [in] must be 0 */
  devalloc_device_address src;      /* [in] inside a live allocation of device */
  void* dst;                        /* [in] host memory, nbytes writable */
  uint64_t nbytes;                  /* [in] 0 is a no-op (dst, src unchecked) */
} devalloc_copy_to_host_args;

/* (ABI 1.2) A range of device memory mapped into the host (PLUGIN-22). */
typedef struct devalloc_map_args {
  size_t struct_size;               /* [in] */
  uint32_t device;                  /* [in] */
  uint32_t reserved0;               /* [in] must be 0 */
  devalloc_device_address address;  /* [in] inside a live allocation of device */
  uint64_t nbytes;                  /* [in] > 0; the range lies in that one
                                     * allocation */
  void* host;                       /* [out] the range's bytes in the host */
} devalloc_map_args;

/* ------------------------------------------------------------------------ */
/* The function table, version 1                                             */
/* ------------------------------------------------------------------------ */

typedef struct devalloc_plugin_api_v1 {
  size_t struct_size;       /* sizeof as the plugin was compiled */
  uint32_t abi_major;       /* 1 */
  uint32_t abi_minor;       /* minor the plugin implements: the
                               plugin_minor that negotiation answered */
  /* Static strings, valid while the library is loaded. */
  const char* plugin_name;    /* e.g. "cuda" */
  const char* plugin_version; /* free form, e.g. "1.2.0" */

  /* Creates an instance. Opens the vendor runtime, enumerates devices.
   * OK; INVALID_ARGUMENT (unknown option or bad value);
   * RUNTIME_UNAVAILABLE (vendor library missing or failing);
   * OUT_OF_HOST_MEMORY. */
  devalloc_status (*create)(devalloc_create_args* args, devalloc_error* error);

  /* Waits for all work of the instance, calls every pending on_release,
   * frees every allocation still live, and frees the instance. Never fails.
   * Not thread-safe against other calls on the same instance. */
  void (*destroy)(devalloc_instance* instance);

  /* OK; INVALID_ARGUMENT (NULL). */
  devalloc_status (*get_capabilities)(devalloc_instance* instance,
                                      devalloc_capabilities* capabilities,
                                      devalloc_error* error);

  /* Number of devices this instance serves; may be 0.
   * OK; INVALID_ARGUMENT (NULL). */
  devalloc_status (*get_device_count)(devalloc_instance* instance,
                                      uint32_t* count, devalloc_error* error);

  /* OK; INVALID_ARGUMENT; NO_SUCH_DEVICE; DEVICE_ERROR. */
  devalloc_status (*get_device_properties)(devalloc_instance* instance,
                                           uint32_t device,
                                           devalloc_device_properties* properties,
                                           devalloc_error* error);

  /* Allocates nbytes of device memory aligned to alignment. The address
   * is unique on that device within the process: no live allocation of the
   * device, from this instance or any other instance of the plugin, shares
   * it, since a host exports device memory as a (device, address) pair
   * (DLPack).
   * OK; INVALID_ARGUMENT (alignment not a power of two, NULL);
   * NO_SUCH_DEVICE; OUT_OF_DEVICE_MEMORY (including sizes no device could
   * ever hold); UNSUPPORTED (alignment above max_alignment); DEVICE_ERROR. */
  devalloc_status (*allocate)(devalloc_instance* instance,
                              devalloc_allocate_args* args,
                              devalloc_error* error);

  /* Frees an address returned by allocate() of this instance on the same
   * device. 0 is a no-op. The caller has synchronized every copy into the allocation.
   * OK; INVALID_ARGUMENT (unknown address); NO_SUCH_DEVICE; DEVICE_ERROR. */
  devalloc_status (*deallocate)(devalloc_instance* instance, uint32_t device,
                                devalloc_device_address address,
                                devalloc_error* error);

  /* Copies nbytes from host src to device dst. With DEVALLOC_SRC_DURING_CALL
   * src has been read (or copied by the plugin) when the call returns. With
   * DEVALLOC_SRC_UNTIL_RELEASED the copy may still be in flight; see
   * devalloc_release_fn. The bytes are on the device at the latest when
   * synchronize(device) returns. The call may block while the plugin's
   * own queue is full, waiting only for copies already submitted that end
   * without further host calls, never for a synchronize (PLUGIN-25).
   * OK; INVALID_ARGUMENT (range outside a live allocation, NULL src with
   * nbytes > 0, unknown src_lifetime); NO_SUCH_DEVICE; DEVICE_ERROR. */
  devalloc_status (*copy_host_to_device)(devalloc_instance* instance,
                                         const devalloc_copy_to_device_args* args,
                                         devalloc_error* error);

  /* Copies nbytes from device src to host dst; dst is written when the call
   * returns. Orders after every copy to the device issued before it on the
   * calling thread.
   * OK; INVALID_ARGUMENT; NO_SUCH_DEVICE; DEVICE_ERROR. */
  devalloc_status (*copy_device_to_host)(devalloc_instance* instance,
                                         const devalloc_copy_to_host_args* args,
                                         devalloc_error* error);

  /* When it returns, every copy to device issued before the call, from any
   * thread, has landed and its on_release (if any) has been called
   * (PLUGIN-17, PLUGIN-20). Correct whatever device or context is current
   * on the calling thread. An asynchronous failure since the previous
   * synchronize of the device is reported here once, as DEVICE_ERROR, and
   * then cleared; a device that is lost keeps failing every call.
   * OK; NO_SUCH_DEVICE; DEVICE_ERROR (an earlier asynchronous copy failed,
   * or the device is lost). */
  devalloc_status (*synchronize)(devalloc_instance* instance, uint32_t device,
                                 devalloc_error* error);

  /* [optional] DMA-friendly host memory for staging; present only with
   * DEVALLOC_CAPABILITY_HOST_STAGING. The host copies from it to every
   * device of the instance (PLUGIN-18). nbytes == 0 gives *host == NULL.
   * OK; INVALID_ARGUMENT; OUT_OF_HOST_MEMORY; DEVICE_ERROR. */
  devalloc_status (*allocate_host)(devalloc_instance* instance, uint64_t nbytes,
                                   void** host, devalloc_error* error);
  /* [optional] Frees memory from allocate_host(); NULL is a no-op. The
   * caller has waited for the release of every copy that reads it.
   * OK; INVALID_ARGUMENT (unknown pointer). */
  devalloc_status (*free_host)(devalloc_instance* instance, void* host,
                               devalloc_error* error);

  /* ---- ABI 1.1: appended; a host reads these only when struct_size covers
   * them (DEVALLOC_PLUGIN_API_V1_1_SIZE) and uses them only when non-NULL.
   */

  /* [optional] Memory of device now: *free_bytes is what allocate() could
   * still hand out (a snapshot; other users of the device may change it),
   * *total_bytes the device's total, as in devalloc_device_properties.
   * *free_bytes <= *total_bytes. free_bytes is the sum of the free memory,
   * not the largest block: an allocation of free_bytes may still fail
   * when the memory is fragmented.
   * OK; INVALID_ARGUMENT (NULL); NO_SUCH_DEVICE; DEVICE_ERROR. */
  devalloc_status (*get_memory_info)(devalloc_instance* instance,
                                     uint32_t device, uint64_t* free_bytes,
                                     uint64_t* total_bytes,
                                     devalloc_error* error);

  /* ---- ABI 1.2: appended; present (non-NULL) together, and only with
   * DEVALLOC_CAPABILITY_HOST_MAPPABLE (PLUGIN-22). */

  /* [optional] Maps [address, address + nbytes) of a live allocation into
   * the host and returns its bytes at args->host: the host may write and
   * read them until it calls unmap_from_host(host). It issues no copy
   * into the range while the range is mapped. Writes through the mapping
   * are on the device once unmap_from_host has returned. The host never
   * maps a range that overlaps one it has mapped and not yet unmapped
   * (OpenCL, for one, refuses overlapping maps for writing), and unmaps
   * each mapping once, before it frees the allocation.
   * OK; INVALID_ARGUMENT (range outside one live allocation, nbytes 0,
   * NULL); NO_SUCH_DEVICE; OUT_OF_HOST_MEMORY; DEVICE_ERROR. */
  devalloc_status (*map_to_host)(devalloc_instance* instance,
                                 devalloc_map_args* args,
                                 devalloc_error* error);
  /* [optional] Ends a mapping from map_to_host() of device; its writes are
   * on the device when this returns.
   * OK; INVALID_ARGUMENT (not a live mapping of device); NO_SUCH_DEVICE;
   * DEVICE_ERROR. */
  devalloc_status (*unmap_from_host)(devalloc_instance* instance,
                                     uint32_t device, void* host,
                                     devalloc_error* error);
} devalloc_plugin_api_v1;

/* What a host requires of a version-1.0 table. */
#define DEVALLOC_PLUGIN_API_V1_MIN_SIZE \
  DEVALLOC_STRUCT_SIZE(devalloc_plugin_api_v1, free_host)
/* A table that holds every function of ABI 1.1. */
#define DEVALLOC_PLUGIN_API_V1_1_SIZE \
  DEVALLOC_STRUCT_SIZE(devalloc_plugin_api_v1, get_memory_info)
/* A table that holds every function of ABI 1.2. */
#define DEVALLOC_PLUGIN_API_V1_2_SIZE \
  DEVALLOC_STRUCT_SIZE(devalloc_plugin_api_v1, unmap_from_host)

/* ------------------------------------------------------------------------ */
/* Negotiation: the plugin's one exported symbol                             */
/* ------------------------------------------------------------------------ */

/* The layout of this struct is frozen across major versions. */
typedef struct devalloc_negotiation {
  size_t struct_size;        /* [in] */
  uint32_t host_min_major;   /* [in] lowest major the host speaks */
  uint32_t host_max_major;   /* [in] highest major the host speaks */
  uint32_t host_max_minor;   /* [in] the host's minor for host_max_major */
  /* [out] On OK: the agreed major, in [host_min_major, host_max_major].
   * On refusal: the highest major the plugin speaks. */
  uint32_t plugin_major;
  uint32_t plugin_minor;     /* [out] the plugin's minor for plugin_major */
  uint32_t plugin_min_major; /* [out] the lowest major the plugin speaks */
  /* [out] On OK: the function table of the agreed major
   * (const devalloc_plugin_api_v1* for major 1), static, valid while the
   * library is loaded. NULL on refusal. */
  const void* api;
} devalloc_negotiation;

/* The plugin picks the highest major it shares with the host.
 * OK; UNSUPPORTED (no common major: the out fields say what the plugin
 * speaks); INVALID_ARGUMENT (NULL, struct_size too small). */
typedef devalloc_status (*devalloc_plugin_negotiate_fn)(
    devalloc_negotiation* negotiation, devalloc_error* error);

/* Plugins define this with DEVALLOC_PLUGIN_EXPORT; hosts never call it by
 * name but look it up with dlsym(DEVALLOC_PLUGIN_ENTRY_POINT_NAME). */
DEVALLOC_PLUGIN_EXPORT devalloc_status devalloc_plugin_negotiate(
    devalloc_negotiation* negotiation, devalloc_error* error);

/* ------------------------------------------------------------------------ */
/* Targets                                                                   */
/* ------------------------------------------------------------------------ */

/* The ABI is defined for LP64 targets only: pointers and size_t of 8 bytes,
 * uint64_t aligned to 8 bytes in structs (Linux on x86-64, AArch64, ppc64le,
 * riscv64). The structs above have no explicit padding, so on a target with
 * 4-byte pointers or a 4-byte-aligned uint64_t (i386 with or without
 * -malign-double, x32, ARM32, riscv32) they would lay out differently from
 * the ABI, and DEVALLOC_PLUGIN_API_V1_MIN_SIZE would not be 128. The header
 * refuses to compile there: with #error where the compiler tells its pointer
 * size (gcc, clang), and for every C89 or C++ compiler with an array of
 * negative size whose name is the message. */
#if defined(__SIZEOF_POINTER__) && defined(__SIZEOF_SIZE_T__)
#if __SIZEOF_POINTER__ != 8 || __SIZEOF_SIZE_T__ != 8
#error "devalloc plugin ABI: defined for LP64 targets only (8-byte pointers and size_t); this target's struct layouts differ"
#endif
#endif
typedef char devalloc_plugin_abi_is_defined_for_LP64_targets_only
    [(sizeof(void*) == 8 && sizeof(size_t) == 8 &&
      offsetof(devalloc_capabilities, flags) == 8) ? 1 : -1];
/* The LP64 layout itself, as the ABI fixes it, which a struct packing option
 * (#pragma pack around the include, -fpack-struct) would change. A minor
 * version that appends fields updates these sizes with them. */
typedef char devalloc_plugin_abi_structs_have_their_LP64_layout
    [(sizeof(devalloc_error) == 1032 && sizeof(devalloc_create_args) == 40 &&
      sizeof(devalloc_capabilities) == 48 &&
      DEVALLOC_CAPABILITIES_V1_1_SIZE == 24 &&
      sizeof(devalloc_device_properties) == 360 &&
      offsetof(devalloc_device_properties, dlpack_device_type) == 320 &&
      DEVALLOC_DEVICE_PROPERTIES_V1_1_SIZE == 328 &&
      sizeof(devalloc_map_args) == 40 &&
      sizeof(devalloc_allocate_args) == 40 &&
      offsetof(devalloc_allocate_args, nbytes) == 16 &&
      sizeof(devalloc_copy_to_device_args) == 56 &&
      offsetof(devalloc_copy_to_device_args, user_data) == 48 &&
      sizeof(devalloc_copy_to_host_args) == 40 &&
      sizeof(devalloc_plugin_api_v1) == 152 &&
      DEVALLOC_PLUGIN_API_V1_MIN_SIZE == 128 &&
      DEVALLOC_PLUGIN_API_V1_1_SIZE == 136 &&
      DEVALLOC_PLUGIN_API_V1_2_SIZE == 152 &&
      sizeof(devalloc_negotiation) == 40 &&
      offsetof(devalloc_negotiation, api) == 32) ? 1 : -1];

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DEVALLOC_PLUGIN_ABI_H */
