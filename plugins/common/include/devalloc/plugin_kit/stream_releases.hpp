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
  virtual ~CallbackStream() = default;
  // None of these throws; each returns the runtime's result.
  virtual int enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept = 0;
  // Queues a callback that calls releases.complete_oldest() once every
  // copy queued before it is over.
  virtual int enqueue_release(ReleaseQueue& releases) noexcept = 0;
  // Waits until everything queued has run.
  virtual int wait() noexcept = 0;
  // After a failed wait: true when the stream reports an error of its own
  // (the context or device is lost: nothing queued runs anymore), false
  // while it is busy or idle.
  virtual bool lost() noexcept = 0;
  virtual void destroy() noexcept = 0;
};

class StreamReleases {
 public:
  explicit StreamReleases(CallbackStream& stream) : stream_(stream) {}

  struct Submitted {
    int copied = 0;    // result of enqueue_copy
    int released = 0;  // result of enqueue_release (0 when not tried)
  };
  // Queues the copy and, behind it, its release callback. If either
  // fails, the release fires once the copy can no longer read src, before
  // this returns; the results say which call failed.
  Submitted copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                                Release release);
  // wait(). On failure the owed releases fire only if the stream is lost;
  // a stream that still runs fires them from its callbacks.
  int wait() noexcept;
  // wait(), retried while the stream is not lost, so that the source of a
  // copy just queued is never given back while the copy may read it.
  int wait_until_over() noexcept;
  // For destroy. `usable`: the runtime can be called for this stream (its
  // context could be made current). Waits, destroys the stream whatever
  // happened (so that no callback into a destroyed plugin runs later), and
  // fires every release still owed: after the stream's own callbacks, or
  // at once when it is idle, lost or unreachable. Idempotent.
  void quiesce(bool usable) noexcept;

  ReleaseQueue& queue() { return releases_; }

 private:
  CallbackStream& stream_;
  bool destroyed_ = false;
  // Keeps the queue's order that of the stream: each callback completes
  // the oldest release.
  std::mutex submit_mutex_;
  ReleaseQueue releases_;
};

}  // namespace devalloc::plugin
