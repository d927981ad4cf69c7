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

bool ReleaseQueue::pop_oldest(Release& out) noexcept {
  std::lock_guard lock(mutex_);
  if (entries_.empty()) return false;
  out = std::move(entries_.front().release);
  entries_.pop_front();
  ++firing_;
  return true;
}

void ReleaseQueue::fired() noexcept {
  std::lock_guard lock(mutex_);
  --firing_;
  progress_.notify_all();
}

void ReleaseQueue::complete_oldest() noexcept {
  Release release;
  if (!pop_oldest(release)) return;
  release.fire();
  fired();
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
