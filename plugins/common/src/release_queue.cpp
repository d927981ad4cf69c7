#include <devalloc/plugin_kit/release_queue.hpp>

#include <algorithm>
#include <utility>

namespace devalloc::plugin {

uint64_t ReleaseQueue::push(Release&& release) {
  std::lock_guard lock(mutex_);
  const uint64_t ticket = next_ticket_;
  // The entry is made empty and filled once it is in: if making room
  // throws, the release is still the caller's, which fires after this lock
  // and the caller's are gone (PLUGIN-14: never under the plugin's locks).
  entries_.push_back(Entry{ticket, Release()});
  entries_.back().release = std::move(release);
  ++next_ticket_;
  return ticket;
}

Release ReleaseQueue::take_back(uint64_t ticket) noexcept {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [ticket](const Entry& e) { return e.ticket == ticket; });
  if (it == entries_.end()) return {};
  Release release = std::move(it->release);
  entries_.erase(it);
  progress_.notify_all();
  return release;
}

bool ReleaseQueue::pop_oldest(Release& out, bool completion) noexcept {
  std::lock_guard lock(mutex_);
  if (entries_.empty()) return false;
  out = std::move(entries_.front().release);
  entries_.pop_front();
  ++firing_;
  // A new completion fires the oldest entry, which is one held if any are:
  // as many complete entries remain unfired as before. Any other pop
  // (fire_all) takes one of those held.
  if (!completion && held_ > 0) --held_;
  return true;
}

void ReleaseQueue::fired() noexcept {
  std::lock_guard lock(mutex_);
  --firing_;
  progress_.notify_all();
}

void ReleaseQueue::complete_oldest() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (holding_) {
      ++held_;
      return;
    }
  }
  Release release;
  if (!pop_oldest(release, /*completion=*/true)) return;
  release.fire();
  fired();
}

void ReleaseQueue::hold_completions() noexcept {
  std::lock_guard lock(mutex_);
  holding_ = true;
}

void ReleaseQueue::fire_held() noexcept {
  {
    std::lock_guard lock(mutex_);
    holding_ = false;
  }
  fire_completed();
}

void ReleaseQueue::fire_completed() noexcept {
  for (;;) {
    Release release;
    {
      // One held entry at a time, checked and taken under one lock: another
      // thread may fire held ones meanwhile, and an entry not complete
      // must never be taken for one.
      std::lock_guard lock(mutex_);
      if (held_ == 0 || entries_.empty()) return;
      --held_;
      release = std::move(entries_.front().release);
      entries_.pop_front();
      ++firing_;
    }
    release.fire();
    fired();
  }
}

void ReleaseQueue::fire_all() noexcept {
  // One at a time, so that nothing here allocates.
  for (Release release; pop_oldest(release);) {
    release.fire();
    fired();
  }
}

void ReleaseQueue::wait_for_earlier() noexcept {
  std::unique_lock lock(mutex_);
  const uint64_t last = next_ticket_ - 1;
  progress_.wait(lock, [&] {
    return firing_ == 0 && (entries_.empty() || entries_.front().ticket > last);
  });
}

size_t ReleaseQueue::pending() const noexcept {
  std::lock_guard lock(mutex_);
  return entries_.size() + firing_;
}

}  // namespace devalloc::plugin
