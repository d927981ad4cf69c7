// The plugin handle's release tracker (loader/src/release_tracker.hpp) with
// an observer, as the validation layer watches it: the observer sees a
// copy's first release before anyone can run the copy's completion.
#include "release_tracker.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace devalloc::detail {
namespace {

// Holds each first release until let_go().
class HoldingObserver final : public ReleaseObserver {
 public:
  void released(const ReleasedCopy& copy) noexcept override {
    std::unique_lock lock(mutex_);
    seen_ = copy;
    entered_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return let_go_; });
    done_ = true;
  }
  void stray(const StrayRelease&) noexcept override {}

  void wait_until_entered() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return entered_; });
  }
  void let_go() {
    std::lock_guard lock(mutex_);
    let_go_ = true;
    changed_.notify_all();
  }
  bool done() {
    std::lock_guard lock(mutex_);
    return done_;
  }
  ReleasedCopy seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  ReleasedCopy seen_;
  bool entered_ = false;
  bool let_go_ = false;
  bool done_ = false;
};

TEST(ReleaseTracker, GivenAnObserverCheckingARelease_WhenTheCallReturnsMeanwhile_ThenTheCompletionWaitsForIt) {
  ReleaseTracker tracker("test");
  HoldingObserver observer;
  tracker.observe(&observer);
  const int source = 7;
  std::atomic<bool> completed{false};
  std::atomic<bool> completed_after_observer{false};
  void* token = tracker.issue(0, 0x1000, &source, sizeof source, nullptr, [&](CopyOutcome&& o) {
    completed_after_observer = observer.done();
    EXPECT_TRUE(o.call.ok());
    completed = true;
  });
  const uint64_t copy = tracker.copy_of(token);
  ASSERT_NE(copy, 0u);
  tracker.note_check(copy, 42);

  // The plugin releases on a thread of its own while its call still runs.
  std::thread plugin([&] { tracked_release_callback()(token); });
  observer.wait_until_entered();
  EXPECT_EQ(observer.seen().id, copy);
  EXPECT_EQ(observer.seen().src, &source);
  EXPECT_EQ(observer.seen().check, 42u);
  // The call returns meanwhile: the completion must wait for the observer.
  std::thread caller([&] { tracker.returned(token, Status()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(completed) << "the copy completed while its release was being checked";
  observer.let_go();
  plugin.join();
  caller.join();
  EXPECT_TRUE(completed);
  EXPECT_TRUE(completed_after_observer);
  EXPECT_EQ(tracker.in_flight(), 0u);
  tracker.observe(nullptr);
}

TEST(ReleaseTracker, GivenCopiesNotReleased_ThenUnreleasedNamesThoseASynchronizeCoveredAndMarksThemOnce) {
  ReleaseTracker tracker("test");
  const char bytes[64] = {};
  void* first = tracker.issue(0, 0x1000, bytes, 32, nullptr, {});
  tracker.returned(first, Status());
  const uint64_t covered = tracker.returned_calls();
  void* later = tracker.issue(0, 0x2000, bytes + 32, 32, nullptr, {});
  tracker.returned(later, Status());
  void* other_device = tracker.issue(1, 0x3000, bytes, 8, nullptr, {});
  tracker.returned(other_device, Status());

  Unreleased u = tracker.unreleased(0, covered, /*mark=*/true);
  EXPECT_EQ(u.count, 1u) << "the later copy's call returned after the synchronize began";
  EXPECT_EQ(u.newly, 1u);
  EXPECT_NE(u.first.find("dst 0x1000"), std::string::npos) << u.first;
  u = tracker.unreleased(0, covered, true);
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(u.newly, 0u) << "reported already";
  EXPECT_EQ(tracker.unreleased(ReleaseTracker::kAnyDevice, UINT64_MAX, false).count, 3u);

  EXPECT_TRUE(tracker.unreleased_reads(bytes + 40, 1));
  EXPECT_FALSE(tracker.unreleased_reads(bytes + 64, 1));
  for (void* token : {first, later, other_device}) tracked_release_callback()(token);
  EXPECT_FALSE(tracker.unreleased_reads(bytes, 64));
  EXPECT_EQ(tracker.unreleased_count(), 0u);
  EXPECT_EQ(tracker.remembered(), 3u) << "three released copies remembered";
}

}  // namespace
}  // namespace devalloc::detail
