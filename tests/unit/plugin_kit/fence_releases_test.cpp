// The kit's releases for fence-value engines (a timeline semaphore, a DMA
// ring's counter), against a fake fence: a counter that a test raises, and
// values that a test makes fail (a device lost).
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/fence_releases.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace devalloc::plugin {
namespace {

// A bound on waits for something that must happen: a broken helper fails
// the test instead of hanging it. Never a measure of speed.
constexpr auto kMustHappenWithin = std::chrono::seconds(30);

class FakeFence {
 public:
  void signal(uint64_t value) {
    {
      std::lock_guard lock(mutex_);
      if (value > counter_) counter_ = value;
    }
    changed_.notify_all();
  }
  // Waits of these values throw, as a device lost while they ran.
  void fail(uint64_t value) {
    {
      std::lock_guard lock(mutex_);
      failing_.insert(value);
    }
    changed_.notify_all();
  }
  void lose() {
    {
      std::lock_guard lock(mutex_);
      lost_ = true;
    }
    changed_.notify_all();
  }
  void wait(uint64_t value) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return counter_ >= value || lost_ || failing_.count(value) > 0; });
    if (counter_ >= value) return;
    throw Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                  "fake wait(" + std::to_string(value) + ") failed: device lost"};
  }
  FenceReleases::Wait waiter() {
    return [this](uint64_t value) { wait(value); };
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t counter_ = 0;
  bool lost_ = false;
  std::set<uint64_t> failing_;
};

// Which releases fired, in order.
class Fired {
 public:
  struct Tag {
    Fired* fired;
    int id;
  };
  Release release(int id) {
    tags_.push_back(Tag{this, id});
    return Release(&Fired::on_release, &tags_.back());
  }
  std::vector<int> order() {
    std::lock_guard lock(mutex_);
    return order_;
  }
  // True once `count` releases fired, false if that did not happen within
  // kMustHappenWithin.
  bool await(size_t count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, kMustHappenWithin, [&] { return order_.size() >= count; });
  }

 private:
  static void on_release(void* p) {
    auto* tag = static_cast<Tag*>(p);
    {
      std::lock_guard lock(tag->fired->mutex_);
      tag->fired->order_.push_back(tag->id);
    }
    tag->fired->changed_.notify_all();
  }
  std::deque<Tag> tags_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int> order_;
};

TEST(FenceReleases, GivenThreeValues_WhenTheFenceReachesEach_ThenReleasesFireInOrderAndNoSooner) {
  FakeFence fence;
  Fired fired;
  FenceReleases releases(fence.waiter());
  releases.push(1, 0, fired.release(1));
  releases.push(2, 0, fired.release(2));
  releases.push(3, 0, fired.release(3));
  fence.signal(1);
  releases.wait_for(1);
  // The fence stands at 1: the wait for 2 cannot have returned.
  EXPECT_EQ(fired.order(), (std::vector<int>{1}));
  fence.signal(3);
  releases.wait_for(3);
  EXPECT_EQ(fired.order(), (std::vector<int>{1, 2, 3}));
}

TEST(FenceReleases, GivenAReachedValue_WhenNobodySynchronizes_ThenItsReleaseFiresAnyway) {
  FakeFence fence;
  Fired fired;
  FenceReleases releases(fence.waiter());
  releases.push(1, 0, fired.release(1));
  releases.push(2, 0, fired.release(2));
  fence.signal(2);
  // No wait_for, no take_error: the worker alone fires them.
  ASSERT_TRUE(fired.await(2));
  EXPECT_EQ(fired.order(), (std::vector<int>{1, 2}));
}

TEST(FenceReleases, GivenPushesSharingAValue_WhenItIsReached_ThenAllOfThemFire) {
  FakeFence fence;
  Fired fired;
  FenceReleases releases(fence.waiter());
  releases.push(4, 0, fired.release(1));
  releases.push(4, 1, fired.release(2));
  fence.signal(4);
  releases.wait_for(4);
  EXPECT_EQ(fired.order(), (std::vector<int>{1, 2}));
}

TEST(FenceReleases, GivenOneEngineServingTwoDevices_WhenAWaitFails_ThenOnlyThatDeviceReportsIt) {
  FakeFence fence;
  Fired fired;
  FenceReleases releases(fence.waiter());
  releases.push(1, 0, fired.release(1));
  releases.push(2, 1, fired.release(2));
  releases.push(3, 0, fired.release(3));
  fence.signal(1);
  fence.fail(2);
  releases.wait_for(2);
  fence.signal(3);
  releases.wait_for(3);
  // The release of the failed wait fired too: nothing reads its source.
  EXPECT_EQ(fired.order(), (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(releases.take_error(0).has_value());
  const auto error = releases.take_error(1);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("fake wait(2) failed: device lost"), std::string::npos) << *error;
}

TEST(FenceReleases, GivenAFailedWait_WhenItsErrorIsTaken_ThenTheNextTakeReportsNothing) {
  FakeFence fence;
  Fired fired;
  FenceReleases releases(fence.waiter());
  releases.push(1, 7, fired.release(1));
  fence.fail(1);
  releases.wait_for(1);
  EXPECT_TRUE(releases.take_error(7).has_value());
  EXPECT_FALSE(releases.take_error(7).has_value());
}

TEST(FenceReleases, GivenTwoFailedWaitsOfOneDevice_WhenTaken_ThenTheCountAndTheFirstAreReported) {
  FakeFence fence;
  Fired fired;
  FenceReleases releases(fence.waiter());
  releases.push(1, 0, fired.release(1));
  releases.push(2, 0, fired.release(2));
  fence.fail(1);
  fence.fail(2);
  releases.wait_for(2);
  const auto error = releases.take_error(0);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(*error, "2 copies failed; the first: fake wait(1) failed: device lost");
}

TEST(FenceReleases, GivenUnreachedValues_WhenDestroyed_ThenItWaitsForThemAndFiresEveryRelease) {
  FakeFence fence;
  Fired fired;
  auto releases = std::make_unique<FenceReleases>(fence.waiter());
  releases->push(1, 0, fired.release(1));
  releases->push(2, 0, fired.release(2));
  std::thread destroyer([&] { releases.reset(); });
  // Destroy cannot return before the fence reaches 2: the copies may read
  // their sources until then.
  fence.signal(2);
  destroyer.join();
  EXPECT_EQ(fired.order(), (std::vector<int>{1, 2}));
}

TEST(FenceReleases, GivenALostDevice_WhenDestroyed_ThenEveryReleaseStillFiresOnce) {
  FakeFence fence;
  Fired fired;
  {
    FenceReleases releases(fence.waiter());
    releases.push(1, 0, fired.release(1));
    releases.push(2, 0, fired.release(2));
    releases.push(5, 1, fired.release(3));
    fence.lose();
  }
  EXPECT_EQ(fired.order(), (std::vector<int>{1, 2, 3}));
}

TEST(FenceReleases, GivenAWaitThatThrowsSomethingElse_WhenWaited_ThenTheReleaseFiresAndTheErrorIsKept) {
  Fired fired;
  FenceReleases releases([](uint64_t) { throw std::runtime_error("wait broke"); });
  releases.push(1, 3, fired.release(1));
  releases.wait_for(1);
  EXPECT_EQ(fired.order(), (std::vector<int>{1}));
  EXPECT_EQ(releases.take_error(3), std::optional<std::string>("wait broke"));
}

TEST(FenceReleases, GivenADecreasingValue_WhenPushed_ThenRefusedWithTheReleaseLeftToTheCaller) {
  FakeFence fence;
  Fired fired;
  FenceReleases releases(fence.waiter());
  releases.push(5, 0, fired.release(1));
  Release late = fired.release(2);
  try {
    releases.push(4, 0, std::move(late));
    FAIL() << "a decreasing value was accepted";
  } catch (const Failure& f) {
    EXPECT_EQ(f.status, DEVALLOC_STATUS_INTERNAL);
    EXPECT_NE(f.message.find("fence value 4 pushed after 5"), std::string::npos) << f.message;
  }
  EXPECT_TRUE(static_cast<bool>(late));
  late.fire();
  fence.signal(5);
  releases.wait_for_all_pushed();
  EXPECT_EQ(fired.order(), (std::vector<int>{2, 1}));
}

TEST(FenceReleases, GivenManyThreadsPushingUnderOneLock_WhenAllSignalled_ThenEveryReleaseFiresInValueOrder) {
  FakeFence fence;
  Fired fired;
  std::mutex submit;
  uint64_t next = 0;
  constexpr int kThreads = 4;
  constexpr int kEach = 50;
  std::vector<Release> made;
  for (int i = 0; i < kThreads * kEach; ++i) made.push_back(fired.release(i));
  FenceReleases releases(fence.waiter());
  std::vector<std::thread> threads;
  std::vector<int> ids(kThreads * kEach);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard lock(submit);
        const uint64_t value = ++next;
        ids[value - 1] = t * kEach + i;
        releases.push(value, static_cast<uint32_t>(t), std::move(made[t * kEach + i]));
        fence.signal(value);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  releases.wait_for_all_pushed();
  EXPECT_EQ(fired.order(), ids);
}

}  // namespace
}  // namespace devalloc::plugin
