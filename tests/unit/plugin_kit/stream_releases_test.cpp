// The kit's release logic for callback-driven streams, against a scripted
// stream: which failures may fire a release and which must not.
#include <devalloc/plugin_kit/stream_releases.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace devalloc::plugin {
namespace {

constexpr int kFailed = 7;
constexpr int kOutOfMemory = 2;

// A stream that queues copies and callbacks and runs them when told.
class ScriptedStream : public CallbackStream {
 public:
  int enqueue_copy(uint64_t, const void*, uint64_t) noexcept override {
    if (fail_copy) return kFailed;
    work.push_back([] {});
    return 0;
  }
  int enqueue_release(ReleaseQueue& releases) noexcept override {
    if (fail_callback) return kOutOfMemory;
    work.push_back([&releases] { releases.complete_oldest(); });
    return 0;
  }
  int wait() noexcept override {
    ++waits;
    if (wait_result != 0) return wait_result;
    run_all();
    return 0;
  }
  bool lost() noexcept override { return is_lost; }
  void destroy() noexcept override {
    ++destroyed;
    if (!is_lost) run_all();  // the runtime finishes a live stream's work
  }
  void run_all() {
    while (!work.empty()) {
      auto op = std::move(work.front());
      work.pop_front();
      op();
    }
  }

  std::deque<std::function<void()>> work;
  bool fail_copy = false;
  bool fail_callback = false;
  bool is_lost = false;
  int wait_result = 0;
  int waits = 0;
  int destroyed = 0;
};

struct Counter {
  int fired = 0;
  static void on_release(void* self) { ++static_cast<Counter*>(self)->fired; }
  Release release() { return Release(&Counter::on_release, this); }
};

TEST(StreamReleases, ReleaseFiresOnlyWhenTheStreamReachesItsCallback) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter counter;
  const auto submitted = releases.copy_until_released(0, nullptr, 1, counter.release());
  EXPECT_EQ(submitted.copied, 0);
  EXPECT_EQ(submitted.released, 0);
  EXPECT_EQ(counter.fired, 0);
  EXPECT_EQ(releases.wait(), 0);
  EXPECT_EQ(counter.fired, 1);
}

TEST(StreamReleases, WaitFailsWhileTheStreamLives_NoReleaseFires) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter counter;
  releases.copy_until_released(0, nullptr, 1, counter.release());
  stream.wait_result = kFailed;
  EXPECT_EQ(releases.wait(), kFailed);
  EXPECT_EQ(counter.fired, 0);
  stream.wait_result = 0;
  EXPECT_EQ(releases.wait(), 0);
  EXPECT_EQ(counter.fired, 1);
}

TEST(StreamReleases, WaitFailsAndTheStreamIsLost_EveryOwedReleaseFiresOnce) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  std::vector<Counter> counters(3);
  for (auto& c : counters) releases.copy_until_released(0, nullptr, 1, c.release());
  stream.wait_result = kFailed;
  stream.is_lost = true;
  EXPECT_EQ(releases.wait(), kFailed);
  for (const auto& c : counters) EXPECT_EQ(c.fired, 1);
  releases.quiesce(true);
  for (const auto& c : counters) EXPECT_EQ(c.fired, 1);
}

TEST(StreamReleases, CopyCannotBeQueued_ReleaseFiresBeforeTheCallReturns) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter counter;
  stream.fail_copy = true;
  const auto submitted = releases.copy_until_released(0, nullptr, 1, counter.release());
  EXPECT_EQ(submitted.copied, kFailed);
  EXPECT_EQ(counter.fired, 1);
  EXPECT_EQ(stream.waits, 0);
}

TEST(StreamReleases, CallbackCannotBeQueued_WaitsForTheCopyThenFires) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter earlier, mine;
  releases.copy_until_released(0, nullptr, 1, earlier.release());
  stream.fail_callback = true;
  const auto submitted = releases.copy_until_released(0, nullptr, 1, mine.release());
  EXPECT_EQ(submitted.released, kOutOfMemory);
  EXPECT_EQ(stream.waits, 1);
  EXPECT_EQ(mine.fired, 1);
  EXPECT_EQ(earlier.fired, 1);  // its own callback ran in the wait
}

TEST(StreamReleases, QuiesceWithoutAccessToTheRuntime_StillDestroysTheStreamOnce) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter counter;
  releases.copy_until_released(0, nullptr, 1, counter.release());
  releases.quiesce(false);
  releases.quiesce(false);
  EXPECT_EQ(stream.destroyed, 1);
  EXPECT_EQ(stream.waits, 0);
  EXPECT_EQ(counter.fired, 1);
}

// A release popped by a callback thread counts until its on_release has
// returned: quiesce() waits with wait_for_earlier() before destroy returns,
// and a host may free the release's user_data once destroy returned.
TEST(ReleaseQueue, WaitForEarlier_ReturnsOnlyAfterAReleaseBeingFiredHasReturned) {
  struct Gate {
    std::mutex mutex;
    std::condition_variable changed;
    bool entered = false;
    bool open = false;
    std::atomic<bool> returned{false};
    static void on_release(void* self) {
      auto& gate = *static_cast<Gate*>(self);
      std::unique_lock lock(gate.mutex);
      gate.entered = true;
      gate.changed.notify_all();
      gate.changed.wait(lock, [&] { return gate.open; });
      gate.returned = true;
    }
  } gate;
  ReleaseQueue queue;
  queue.push(Release(&Gate::on_release, &gate));
  std::thread callback([&] { queue.complete_oldest(); });
  {
    std::unique_lock lock(gate.mutex);
    gate.changed.wait(lock, [&] { return gate.entered; });
  }
  // Lets the release return a little later; a wait_for_earlier that does
  // not wait for it returns before that.
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard lock(gate.mutex);
    gate.open = true;
    gate.changed.notify_all();
  });
  queue.wait_for_earlier();
  EXPECT_TRUE(gate.returned) << "wait_for_earlier returned while the release was still running";
  opener.join();
  callback.join();
  EXPECT_EQ(queue.pending(), 0u);
}

}  // namespace
}  // namespace devalloc::plugin
