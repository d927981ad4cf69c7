#include <devalloc/plugin_kit/stream_releases.hpp>

#include <utility>

namespace devalloc::plugin {
namespace {
// A failed wait is retried this often while the stream is not lost.
constexpr int kWaitAttempts = 3;
}  // namespace

StreamReleases::Submitted StreamReleases::copy_until_released(uint64_t dst, const void* src,
                                                              uint64_t nbytes,
                                                              Release release) {
  Submitted result;
  Release mine;
  {
    std::lock_guard submit(submit_mutex_);
    // Queued before the copy, so that nothing is in flight that the
    // release could not follow.
    const uint64_t ticket = releases_.push(std::move(release));
    result.copied = stream_.enqueue_copy(dst, src, nbytes);
    if (result.copied == 0) result.released = stream_.enqueue_release(releases_);
    if (result.copied == 0 && result.released == 0) return result;
    // No callback will release this source: take the release back (absent
    // if a lost stream fired it already).
    mine = releases_.take_back(ticket);
  }
  // If the copy was queued, it may still read src: wait until it is over.
  if (result.copied == 0) wait_until_over();
  mine.fire();
  return result;
}

int StreamReleases::wait() noexcept {
  const int result = stream_.wait();
  if (result != 0 && stream_.lost()) releases_.fire_all();
  return result;
}

int StreamReleases::wait_until_over() noexcept {
  int result = wait();
  for (int attempt = 1; attempt < kWaitAttempts && result != 0 && !stream_.lost(); ++attempt) {
    result = wait();
  }
  return result;
}

void StreamReleases::quiesce(bool usable) noexcept {
  if (destroyed_) return;
  bool idle = false;
  if (usable) idle = wait_until_over() == 0 || stream_.lost();
  stream_.destroy();
  destroyed_ = true;
  // The stream still runs (a wait failed, the stream is not lost): its
  // remaining callbacks fire their releases as it finishes.
  if (usable && !idle) releases_.wait_for_earlier();
  releases_.fire_all();
}

}  // namespace devalloc::plugin
