#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/fence_releases.hpp>

#include <cinttypes>
#include <exception>
#include <new>
#include <utility>
#include <vector>

namespace devalloc::plugin {

FenceReleases::FenceReleases(Wait wait) : wait_(std::move(wait)), worker_([this] { run(); }) {}

FenceReleases::~FenceReleases() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_one();
  worker_.join();
}

void FenceReleases::push(uint64_t value, uint32_t device, Release&& release) {
  {
    std::lock_guard lock(mutex_);
    if (value < last_pushed_) {
      throw Failure{DEVALLOC_STATUS_INTERNAL,
                    format("fence value %" PRIu64 " pushed after %" PRIu64
                           ": values must not decrease (push under the submission lock)",
                           value, last_pushed_)};
    }
    // Filled once it is in: if making room throws, `release` is untouched.
    entries_.push_back(Entry{value, device, Release{}});
    entries_.back().release = std::move(release);
    last_pushed_ = value;
  }
  work_ready_.notify_one();
}

void FenceReleases::wait_for(uint64_t value) noexcept {
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [&] {
    const bool firing = firing_ && firing_value_ <= value;
    return !firing && (entries_.empty() || entries_.front().value > value);
  });
}

void FenceReleases::wait_for_all_pushed() noexcept {
  uint64_t last = 0;
  {
    std::lock_guard lock(mutex_);
    last = last_pushed_;
  }
  wait_for(last);
}

std::optional<std::string> FenceReleases::take_error(uint32_t device) {
  std::lock_guard lock(mutex_);
  auto it = failures_.find(device);
  if (it == failures_.end()) return std::nullopt;
  Failures f = std::move(it->second);
  failures_.erase(it);
  if (f.count == 1) return std::move(f.first);
  return std::to_string(f.count) + " copies failed; the first: " + f.first;
}

namespace {
// failure = text; an empty text (still a failure) when the copy cannot be
// made: run() is noexcept, and a bad_alloc out of a handler would end the
// process.
void keep_failure(std::optional<std::string>& failure, const char* text) noexcept {
  try {
    failure = text;
  } catch (const std::bad_alloc&) {
    failure.emplace();  // std::string() allocates nothing
  }
}
}  // namespace

void FenceReleases::run() noexcept {
  std::vector<Entry> batch;
  std::unique_lock lock(mutex_);
  for (;;) {
    // Entries pushed before destroy are still waited for and fired: the
    // copies they release may read their sources until their value.
    work_ready_.wait(lock, [&] { return stopping_ || !entries_.empty(); });
    if (entries_.empty()) return;
    const uint64_t value = entries_.front().value;
    lock.unlock();
    std::optional<std::string> failure;
    try {
      wait_(value);
    } catch (const Failure& f) {
      keep_failure(failure, f.message.c_str());
    } catch (const std::exception& e) {
      keep_failure(failure, e.what());
    } catch (...) {
      keep_failure(failure, "unknown exception");
    }
    lock.lock();
    // Every entry up to the value is over (or never will be), also those
    // pushed with the same value while the wait ran.
    try {
      batch.reserve(entries_.size());
    } catch (const std::bad_alloc&) {
      // Fired one by one below instead.
    }
    firing_ = true;
    firing_value_ = value;
    while (!entries_.empty() && entries_.front().value <= value) {
      Entry entry = std::move(entries_.front());
      entries_.pop_front();
      if (failure) record_failure(entry.device, *failure);
      if (batch.size() < batch.capacity()) {
        batch.push_back(std::move(entry));
      } else {
        lock.unlock();
        entry.release.fire();
        lock.lock();
      }
    }
    lock.unlock();
    // Oldest first, outside the lock: an on_release may take its time.
    for (Entry& entry : batch) entry.release.fire();
    batch.clear();
    lock.lock();
    firing_ = false;
    work_done_.notify_all();
  }
}

void FenceReleases::record_failure(uint32_t device, const std::string& message) noexcept {
  try {
    Failures& f = failures_[device];
    if (f.count++ == 0) f.first = message;
  } catch (const std::bad_alloc&) {
    // Not even the entry fits: the failure goes unreported; the release
    // still fires.
  }
}

}  // namespace devalloc::plugin
