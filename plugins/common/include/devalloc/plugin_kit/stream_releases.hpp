// Releases on a runtime whose streams run a completion callback after each
// queued copy, in stream order (CUDA host functions, HIP stream callbacks):
// the order of submission, the release of a copy whose callback could not
// be queued, what a failed stream wait may and may not fire, and destroy.
// The vendor implements CallbackStream over its runtime; results are the
// runtime's codes, 0 meaning success (as CUDA_SUCCESS and hipSuccess).
#pragma once

#include <devalloc/plugin_kit/release_queue.hpp>

#include <cstdint>
#include <mutex>

namespace devalloc::plugin {

class CallbackStream {
 public:
  // What the stream's query answers.
  enum class State {
    idle,  // everything queued has run, callbacks included
    busy,  // queued work has not run yet
    lost,  // an error of the stream's own, answered to every query (the
           // context or device is lost: nothing queued runs anymore, no
           // callback comes)
  };

  virtual ~CallbackStream() = default;
  // None of these throws; each returns the runtime's result.
  virtual int enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept = 0;
  // Queues a callback that calls releases.complete_oldest() once every
  // copy queued before it is over.
  virtual int enqueue_release(ReleaseQueue& releases) noexcept = 0;
  // Waits until everything queued has run.
  virtual int wait() noexcept = 0;
  // The stream's query (cuStreamQuery, hipStreamQuery); never blocks.
  virtual State query() noexcept = 0;
  virtual void destroy() noexcept = 0;
};

class StreamReleases {
 public:
  // callbacks_per_wait: when not 0, at most this many release callbacks are
  // queued between two waits of copy_until_released's own (for a runtime
  // that fails when too many callbacks pile up between synchronizes).
  explicit StreamReleases(CallbackStream& stream, uint64_t callbacks_per_wait = 0)
      : stream_(stream), callbacks_per_wait_(callbacks_per_wait) {}

  struct Submitted {
    int waited = 0;    // result of the wait the bound made (0 when none);
                       // when it failed, nothing was queued
    int copied = 0;    // result of enqueue_copy (0 when not tried)
    int released = 0;  // result of enqueue_release (0 when not tried)
  };
  // Queues the copy and, behind it, its release callback; first, when
  // callbacks_per_wait callbacks were queued since the last such wait,
  // waits until the stream is over (wait_until_over) with the submission
  // lock held, so that nothing is queued on this stream meanwhile (other
  // copies go through submit()); no release fires under that lock: the
  // callbacks that run meanwhile only count their completions
  // (ReleaseQueue::hold_completions), which fire once the lock is let go,
  // before this returns (or in a wait_until_over on another thread). If any
  // step fails, the release fires once the copy can no longer read src,
  // before this returns; the results say which call failed.
  Submitted copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                                Release release);
  // Queues other work on the stream (a copy whose caller then waits for
  // it: during call, to host) and returns enqueue()'s result. When
  // callbacks are bounded, with the submission lock held: ROCm cuts its
  // chain of callbacks only at a synchronize during which nothing at all
  // was queued on the stream, so copy_until_released's own wait would cut
  // nothing if another thread queued a copy meanwhile, while the count here
  // starts again from 0.
  template <class Enqueue>
  int submit(Enqueue&& enqueue) noexcept {
    if (callbacks_per_wait_ == 0) return enqueue();
    std::lock_guard lock(submit_mutex_);
    return enqueue();
  }
  // Waits for the stream (for synchronize, and for a copy that must be over
  // before its call returns). Returns only once nothing queued so far can
  // still read or write host memory and every owed release has fired: the
  // stream's wait succeeded, or the stream is idle (its callbacks ran), or
  // it is lost (the owed releases are fired here). A failed wait on a
  // stream that is still busy is not an end: the stream is asked (query)
  // and waited for again, with a pause that grows from 0.1 to 10 ms, for as
  // long as it stays busy. Lost takes kGiveBackAttempts lost answers in a
  // row: one may be a passing failure of the query while copies still run.
  // The result is the first failed wait's, or 0. A device that never
  // completes its work and never reports an error keeps this waiting, as
  // the runtime's own synchronize would.
  int wait_until_over() noexcept;
  // For destroy. `usable`: the runtime can be called for this stream (its
  // context could be made current). Waits until the stream's work is over
  // or lost (wait_until_over), destroys the stream whatever happened (so
  // that no callback into a destroyed plugin runs later), and fires every
  // release still owed: none is left unless the stream is lost, or
  // unreachable, where nothing can be waited for. Idempotent.
  void quiesce(bool usable) noexcept;

  ReleaseQueue& queue() { return releases_; }

 private:
  // wait_until_over without firing anything: `lost` says whether the
  // owed releases are to be fired.
  int await_over(bool& lost) noexcept;

  CallbackStream& stream_;
  const uint64_t callbacks_per_wait_;
  bool destroyed_ = false;
  // Keeps the queue's order that of the stream: each callback completes
  // the oldest release.
  std::mutex submit_mutex_;
  // Callbacks queued since copy_until_released last waited; submit_mutex_.
  uint64_t callbacks_since_wait_ = 0;
  ReleaseQueue releases_;
};

}  // namespace devalloc::plugin
