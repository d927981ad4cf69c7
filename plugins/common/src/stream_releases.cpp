#include <devalloc/plugin_kit/give_back.hpp>
#include <devalloc/plugin_kit/stream_releases.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace devalloc::plugin {
namespace {
// Between a failed wait and the next look at a stream that is still busy:
// short at first (a transient failure costs little), never long (the call
// returns soon after the stream is over).
constexpr std::chrono::microseconds kFirstPause{100};
constexpr std::chrono::microseconds kLongestPause{10'000};
}  // namespace

StreamReleases::Submitted StreamReleases::copy_until_released(uint64_t dst, const void* src,
                                                              uint64_t nbytes,
                                                              Release release) {
  Submitted result;
  Release mine;
  bool lost = false;
  // The releases that callbacks complete while the bound's wait holds the
  // submission lock fire once it is let go (PLUGIN-14: an on_release may
  // wait for another thread's copy, which needs that lock), however this
  // call ends; before the lock_guard below, so destroyed after it.
  struct FireHeld {
    ReleaseQueue& queue;
    bool held = false;
    ~FireHeld() {
      if (held) queue.fire_held();
    }
  } held{releases_};
  {
    std::lock_guard submit(submit_mutex_);
    if (callbacks_per_wait_ != 0 && callbacks_since_wait_ >= callbacks_per_wait_) {
      releases_.hold_completions();
      held.held = true;
      result.waited = await_over(lost);
      if (result.waited == 0) callbacks_since_wait_ = 0;
    }
    if (result.waited != 0) {
      // Nothing queued: the source is the caller's again.
      mine = std::move(release);
    } else {
      // Queued before the copy, so that nothing is in flight that the
      // release could not follow. If that throws (out of memory), `release`
      // is still this call's parameter: it fires once the submission lock
      // is let go.
      const uint64_t ticket = releases_.push(std::move(release));
      result.copied = stream_.enqueue_copy(dst, src, nbytes);
      if (result.copied == 0) result.released = stream_.enqueue_release(releases_);
      if (result.copied == 0 && result.released == 0) {
        ++callbacks_since_wait_;
        return result;
      }
      // No callback will release this source: take the release back (absent
      // if a lost stream fired it already).
      mine = releases_.take_back(ticket);
    }
  }
  if (held.held) {
    held.held = false;
    releases_.fire_held();
  }
  if (lost) releases_.fire_all();
  // If the copy was queued, it may still read src: wait until it is over.
  if (result.waited == 0 && result.copied == 0) wait_until_over();
  mine.fire();
  return result;
}

int StreamReleases::wait_until_over() noexcept {
  bool lost = false;
  const int result = await_over(lost);
  // Completed while another thread's bound wait holds them: this wait
  // returns with every release it covered fired.
  releases_.fire_completed();
  if (lost) releases_.fire_all();
  return result;
}

int StreamReleases::await_over(bool& lost) noexcept {
  const int first = stream_.wait();
  if (first == 0) return 0;
  // The wait failed, but the stream may still run what was queued: a copy
  // that reads its source or writes its destination after this returned
  // would be silent wrong data. Only an idle or lost stream is over.
  // A lost stream reports its error to every query (a sticky error); one
  // failed query may be a passing failure of the runtime, after which the
  // stream still runs its copies: lost only when kGiveBackAttempts queries
  // in a row say so, with a wait between them.
  int lost_answers = 0;
  for (auto pause = kFirstPause;; pause = std::min(pause * 2, kLongestPause)) {
    switch (stream_.query()) {
      case CallbackStream::State::lost:
        if (++lost_answers < kGiveBackAttempts) break;
        lost = true;
        return first;
      case CallbackStream::State::idle:
        return first;
      case CallbackStream::State::busy:
        lost_answers = 0;
        break;
    }
    std::this_thread::sleep_for(pause);
    // A wait that works again blocks until the stream is over.
    if (stream_.wait() == 0) return first;
  }
}

void StreamReleases::quiesce(bool usable) noexcept {
  if (destroyed_) return;
  if (usable) static_cast<void>(wait_until_over());
  stream_.destroy();
  destroyed_ = true;
  // Owed only by a lost or unreachable stream now.
  releases_.fire_all();
  // A release that a callback thread took before the stream was destroyed
  // has returned before destroy does: the host may free its user_data then.
  releases_.wait_for_earlier();
}

}  // namespace devalloc::plugin
