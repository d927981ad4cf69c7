/*
 * What the fake HIP runtime (tests/fakes/hip, built as libamdhip64.so.5)
 * exports besides the HIP API: the test's view into it. Tests look these up
 * with dlsym on the handle of the already-loaded fake:
 *   void* fake = dlopen("/abs/path/libamdhip64.so.5", RTLD_NOW | RTLD_NOLOAD);
 */
#ifndef DEVALLOC_FAKE_HIP_CONTROL_H
#define DEVALLOC_FAKE_HIP_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The violations recorded so far, one a line, into buf (cap bytes with the
 * NUL); returns how many there are. */
int devalloc_fake_hip_violations(char* buf, size_t cap);
typedef int (*devalloc_fake_hip_violations_fn)(char* buf, size_t cap);
/* Forgets violations, call counts and injected failures; resumes streams;
 * puts the copy delay and the callback chain limit back to the
 * environment's. */
void devalloc_fake_hip_reset(void);
typedef void (*devalloc_fake_hip_reset_fn)(void);
/* How long a stream takes per copy from now on (DEVALLOC_FAKE_HIP_DELAY_US
 * until then). */
void devalloc_fake_hip_set_delay_us(uint64_t delay_us);
typedef void (*devalloc_fake_hip_set_delay_us_fn)(uint64_t delay_us);
/* A hipStreamSynchronize or hipStreamDestroy that finds more than `limit`
 * stream callbacks queued since the stream's last completed synchronize is
 * a violation, as ROCm 6.2-6.4 crash there (0: no limit;
 * DEVALLOC_FAKE_HIP_CALLBACK_CHAIN_LIMIT until then). */
void devalloc_fake_hip_set_callback_chain_limit(uint64_t limit);
typedef void (*devalloc_fake_hip_set_callback_chain_limit_fn)(uint64_t limit);
/* The next `count` calls of entry_point return result, doing nothing. */
void devalloc_fake_hip_fail_calls(const char* entry_point, int result, int count);
typedef void (*devalloc_fake_hip_fail_calls_fn)(const char* entry_point, int result, int count);
/* The `skip` calls of entry_point after this one run as usual; the `count`
 * calls after those return result, doing nothing (count <= 0: none). */
void devalloc_fake_hip_fail_calls_after(const char* entry_point, int skip, int result, int count);
typedef void (*devalloc_fake_hip_fail_calls_after_fn)(const char* entry_point, int skip,
                                                      int result, int count);
/* The next call of entry_point, hipMalloc or hipHostMalloc, that would
 * succeed returns hipSuccess with a NULL pointer instead and allocates
 * nothing, as a broken runtime might. */
void devalloc_fake_hip_null_result_next(const char* entry_point);
typedef void (*devalloc_fake_hip_null_result_next_fn)(const char* entry_point);
/* While paused, no stream runs its work; synchronizing waits. */
void devalloc_fake_hip_pause(int paused);
typedef void (*devalloc_fake_hip_pause_fn)(int paused);
/* How often entry_point was called since the last reset. */
uint64_t devalloc_fake_hip_calls(const char* entry_point);
typedef uint64_t (*devalloc_fake_hip_calls_fn)(const char* entry_point);
/* Live device allocations of device (all when device < 0). */
uint64_t devalloc_fake_hip_live_allocations(int device);
typedef uint64_t (*devalloc_fake_hip_live_allocations_fn)(int device);
/* What the user must still free or destroy, one line per kind with live
 * objects ("1 stream(s)"; kinds: "device allocation", "pinned host block",
 * "stream"), into buf; returns how many kinds have live objects. Not
 * cleared by reset. */
int devalloc_fake_hip_live_objects(char* buf, size_t cap);
typedef int (*devalloc_fake_hip_live_objects_fn)(char* buf, size_t cap);
/* The calling thread's current device, as hipGetDevice would answer, but
 * not counted as a call and never failing. */
int devalloc_fake_hip_current_device(void);
typedef int (*devalloc_fake_hip_current_device_fn)(void);
/* Reads device memory directly: 0, or -1 when not live device memory. */
int devalloc_fake_hip_read(uint64_t address, void* dst, size_t nbytes);
typedef int (*devalloc_fake_hip_read_fn)(uint64_t address, void* dst, size_t nbytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DEVALLOC_FAKE_HIP_CONTROL_H */
