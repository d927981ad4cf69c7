/*
 * What the fake Level Zero driver (tests/fakes/level_zero) exports besides
 * its *ProcAddrTable functions: the test's view into it. The driver is
 * loaded by the real Level Zero loader (ZE_ENABLE_ALT_DRIVERS), so tests
 * reach these with dlsym on the already-loaded driver:
 *   void* fake = dlopen("/abs/path/libdevalloc_fake_ze.so.1",
 *                       RTLD_NOW | RTLD_NOLOAD);
 * Names of calls are the API names, e.g. "zeMemAllocDevice".
 */
#ifndef DEVALLOC_FAKE_ZE_CONTROL_H
#define DEVALLOC_FAKE_ZE_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the recorded violations, one per line, into buf (truncated to cap
 * bytes including the NUL; buf may be NULL when cap is 0) and returns how
 * many there are. */
int devalloc_fake_ze_violations(char* buf, size_t cap);
typedef int (*devalloc_fake_ze_violations_fn)(char* buf, size_t cap);

/* Forgets violations, call counts and injected failures; resumes lists. */
void devalloc_fake_ze_reset(void);
typedef void (*devalloc_fake_ze_reset_fn)(void);

/* The next `count` calls of api (e.g. "zeMemAllocDevice") return result (a
 * ze_result_t) without doing anything. */
void devalloc_fake_ze_fail_calls(const char* api, int result, int count);
typedef void (*devalloc_fake_ze_fail_calls_fn)(const char* api, int result,
                                               int count);

/* The `skip` calls of api after this one run as usual; the `count` calls
 * after those return result without doing anything (count <= 0: none). */
void devalloc_fake_ze_fail_calls_after(const char* api, int skip, int result,
                                       int count);
typedef void (*devalloc_fake_ze_fail_calls_after_fn)(const char* api, int skip,
                                                     int result, int count);

/* The next call of api, zeMemAllocDevice or zeMemAllocHost, that would
 * succeed returns ZE_RESULT_SUCCESS with a NULL pointer instead and
 * allocates nothing, as a broken driver might. */
void devalloc_fake_ze_null_result_next(const char* api);
typedef void (*devalloc_fake_ze_null_result_next_fn)(const char* api);

/* The next call of api, zeMemAllocDevice, that would succeed ignores the
 * alignment it was asked for: the memory is aligned to 256 bytes only (never
 * 512), as a driver that does not honour the argument would give it. */
void devalloc_fake_ze_ignore_alignment_next(const char* api);
typedef void (*devalloc_fake_ze_ignore_alignment_next_fn)(const char* api);

/* The next copy a command list executes fails as a hung device would: the
 * copy is not done, its event never signals, and its device is lost (every
 * later call on it returns ZE_RESULT_ERROR_DEVICE_LOST). */
void devalloc_fake_ze_lose_device_on_next_copy(void);
typedef void (*devalloc_fake_ze_lose_device_on_next_copy_fn)(void);

/* While paused (non-zero), no command list executes work. */
void devalloc_fake_ze_pause(int paused);
typedef void (*devalloc_fake_ze_pause_fn)(int paused);

/* How often api was called since the last reset. */
uint64_t devalloc_fake_ze_calls(const char* api);
typedef uint64_t (*devalloc_fake_ze_calls_fn)(const char* api);

/* Live device allocations of device (all devices when device < 0). */
uint64_t devalloc_fake_ze_live_allocations(int device);
typedef uint64_t (*devalloc_fake_ze_live_allocations_fn)(int device);

/* What the user must still free or destroy, one line per kind with live
 * objects ("64 event(s)"; kinds: "device allocation", "pinned host block"
 * (zeMemAllocHost memory), "context", "command list", "event pool",
 * "event"), into buf; returns how many kinds have live objects. Not
 * cleared by reset. */
int devalloc_fake_ze_live_objects(char* buf, size_t cap);
typedef int (*devalloc_fake_ze_live_objects_fn)(char* buf, size_t cap);

/* Reads device memory directly: 0 on success, -1 when
 * [address, address + nbytes) is not live device memory. */
int devalloc_fake_ze_read(uint64_t address, void* dst, size_t nbytes);
typedef int (*devalloc_fake_ze_read_fn)(uint64_t address, void* dst,
                                        size_t nbytes);

/* 1 when p lies in a live zeMemAllocHost block of this driver, else 0.
 * Another copy of the driver in the process (a second driver for the
 * loader) asks this to recognize host memory of a context not its own. */
int devalloc_fake_ze_owns_host_memory(const void* p);
typedef int (*devalloc_fake_ze_owns_host_memory_fn)(const void* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DEVALLOC_FAKE_ZE_CONTROL_H */
