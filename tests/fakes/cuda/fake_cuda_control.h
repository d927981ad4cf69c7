/*
 * What the fake CUDA driver (tests/fakes/cuda, built as libcuda.so.1)
 * exports besides the driver API: the test's view into it. Tests look these
 * up with dlsym on the handle of the already-loaded fake:
 *   void* fake = dlopen("/abs/path/libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
 * The DEVALLOC_FAKE_CUDA_*_FN typedefs are the pointer types to cast to.
 */
#ifndef DEVALLOC_FAKE_CUDA_CONTROL_H
#define DEVALLOC_FAKE_CUDA_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the recorded violations, one per line, into buf (truncated to cap
 * bytes including the NUL; buf may be NULL when cap is 0) and returns how
 * many there are. */
int devalloc_fake_cuda_violations(char* buf, size_t cap);
typedef int (*devalloc_fake_cuda_violations_fn)(char* buf, size_t cap);

/* Forgets violations, call counts and injected failures; resumes streams. */
void devalloc_fake_cuda_reset(void);
typedef void (*devalloc_fake_cuda_reset_fn)(void);

/* The next call of entry_point (the exported name, e.g. "cuMemAlloc_v2")
 * returns result without doing anything. */
void devalloc_fake_cuda_fail_next(const char* entry_point, int result);
typedef void (*devalloc_fake_cuda_fail_next_fn)(const char* entry_point,
                                                int result);

/* The next `count` calls of entry_point return result (count <= 0: none). */
void devalloc_fake_cuda_fail_calls(const char* entry_point, int result, int count);
typedef void (*devalloc_fake_cuda_fail_calls_fn)(const char* entry_point,
                                                 int result, int count);

/* The `skip` calls of entry_point after this one run as usual; the `count`
 * calls after those return result (count <= 0: none). A fault walk fails
 * the k-th call with skip = k - 1, count = 1. */
void devalloc_fake_cuda_fail_calls_after(const char* entry_point, int skip, int result,
                                         int count);
typedef void (*devalloc_fake_cuda_fail_calls_after_fn)(const char* entry_point, int skip,
                                                       int result, int count);

/* The next call of entry_point, cuMemAlloc_v2 or cuMemHostAlloc, that
 * would succeed returns CUDA_SUCCESS with a null result (0, NULL) instead
 * and allocates nothing, as a broken driver might. */
void devalloc_fake_cuda_null_result_next(const char* entry_point);
typedef void (*devalloc_fake_cuda_null_result_next_fn)(const char* entry_point);

/* The next successful call of entry_point calls hook(), on the caller's
 * thread, just before it returns (tests use it to make the plugin's very
 * next step fail). */
void devalloc_fake_cuda_after_next(const char* entry_point, void (*hook)(void));
typedef void (*devalloc_fake_cuda_after_next_fn)(const char* entry_point,
                                                 void (*hook)(void));

/* The next copy that a stream executes fails as a device fault would: the
 * copy is not done and its context keeps `result` as a sticky error, so that
 * every later call in it returns result and no host function runs. */
void devalloc_fake_cuda_fault_next_copy(int result);
typedef void (*devalloc_fake_cuda_fault_next_copy_fn)(int result);

/* While paused (non-zero), no stream executes work; queued work and
 * cuStreamSynchronize wait. */
void devalloc_fake_cuda_pause(int paused);
typedef void (*devalloc_fake_cuda_pause_fn)(int paused);

/* How often entry_point was called since the last reset. */
uint64_t devalloc_fake_cuda_calls(const char* entry_point);
typedef uint64_t (*devalloc_fake_cuda_calls_fn)(const char* entry_point);

/* Live device allocations of device (all devices when device < 0). */
uint64_t devalloc_fake_cuda_live_allocations(int device);
typedef uint64_t (*devalloc_fake_cuda_live_allocations_fn)(int device);

/* What the user must still free, destroy or release, now: one line per kind
 * with live objects ("2 stream(s)"; the kinds are "device allocation",
 * "pinned host block", "stream" and "primary context retain"), into buf
 * (as devalloc_fake_cuda_violations). Returns how many kinds have live
 * objects: 0 once every object was given back. Not cleared by reset. */
int devalloc_fake_cuda_live_objects(char* buf, size_t cap);
typedef int (*devalloc_fake_cuda_live_objects_fn)(char* buf, size_t cap);

/* How many contexts the calling thread has pushed and not popped: what a
 * library that restores the caller's context leaves as it found it. Not
 * counted as a call. */
int devalloc_fake_cuda_context_depth(void);
typedef int (*devalloc_fake_cuda_context_depth_fn)(void);

/* Reads device memory directly, bypassing streams and contexts: 0 on
 * success, -1 when [address, address + nbytes) is not live device memory. */
int devalloc_fake_cuda_read(uint64_t address, void* dst, size_t nbytes);
typedef int (*devalloc_fake_cuda_read_fn)(uint64_t address, void* dst,
                                          size_t nbytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DEVALLOC_FAKE_CUDA_CONTROL_H */
