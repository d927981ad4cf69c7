// The releases owed for copies a runtime is still running, for runtimes that
// signal completion with a callback in stream order (a CUDA host function, a
// HIP stream callback): each callback completes the oldest release. Every
// release fires exactly once, outside the queue's lock, and only when the
// plugin says its copy is over (PLUGIN-14).
#pragma once

#include <devalloc/plugin_kit/release.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

namespace devalloc::plugin {

class ReleaseQueue {
 public:
  ReleaseQueue() = default;
  // Fires whatever is still owed: by then the owner knows no copy runs.
  ~ReleaseQueue() { fire_all(); }
  ReleaseQueue(const ReleaseQueue&) = delete;
  ReleaseQueue& operator=(const ReleaseQueue&) = delete;

  // Appends the release of a copy about to be submitted (moved from
  // `release`) and returns its ticket. Push before submitting, so that the
  // completion cannot come first. Throws bad_alloc with `release` left as
  // it was: it fires when the caller's Release ends (nothing was
  // submitted), after the caller's own locks are let go (PLUGIN-14).
  uint64_t push(Release&& release);
  // Removes the release of a copy whose completion will never be signalled
  // (submitting it or its callback failed). Empty if it already fired. The
  // caller fires it once the copy is known not to read its source anymore.
  Release take_back(uint64_t ticket) noexcept;
  // A stream-ordered completion callback: fires the oldest release, or,
  // while completions are held, only counts it.
  void complete_oldest() noexcept;
  // From now until fire_held, a completion fires nothing: it is counted,
  // and fires later on a thread that holds none of the plugin's locks
  // (PLUGIN-14). For a thread that waits for the stream with a lock held
  // that the host could need (StreamReleases' bound on callbacks).
  void hold_completions() noexcept;
  // Ends holding, then fires every completion held.
  void fire_held() noexcept;
  // Fires the completions held so far, holding or not: for a wait that must
  // return with every release it covered fired (synchronize).
  void fire_completed() noexcept;
  // Fires every release still owed, oldest first. Only for when the
  // runtime will never signal them: the device is idle or lost.
  void fire_all() noexcept;
  // Returns once every release pushed before the call has fired (by
  // callbacks or by fire_all on another thread).
  void wait_for_earlier() noexcept;
  size_t pending() const noexcept;

 private:
  struct Entry {
    uint64_t ticket;
    Release release;
  };
  // Pops the oldest entry into out and counts it as firing; false if none.
  // `completion`: it is popped for a completion that just came (not one of
  // those held, which stay the oldest).
  bool pop_oldest(Release& out, bool completion = false) noexcept;
  void fired() noexcept;

  mutable std::mutex mutex_;
  std::condition_variable progress_;
  std::deque<Entry> entries_;
  uint64_t next_ticket_ = 1;
  // Taken out of entries_ but not yet fired.
  size_t firing_ = 0;
  bool holding_ = false;
  // The oldest held_ entries are complete: their copies are over, their
  // releases not fired yet.
  size_t held_ = 0;
};

}  // namespace devalloc::plugin
