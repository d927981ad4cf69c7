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

// A stream that queues copies and callbacks and runs them when told, on
// any thread: a test may keep a wait failing on one thread and run the
// stream's work on another.
class ScriptedStream : public CallbackStream {
 public:
  int enqueue_copy(uint64_t, const void*, uint64_t) noexcept override {
    if (fail_copy) return kFailed;
    std::lock_guard lock(mutex);
    work.push_back([] {});
    return 0;
  }
  int enqueue_release(ReleaseQueue& releases) noexcept override {
    if (fail_callback) return kOutOfMemory;
    std::lock_guard lock(mutex);
    work.push_back([&releases] { releases.complete_oldest(); });
    return 0;
  }
  int wait() noexcept override {
    ++waits;
    if (const int result = wait_result; result != 0) return result;
    run_all();
    return 0;
  }
  State query() noexcept override {
    ++queries;
    if (is_lost) return State::lost;
    std::lock_guard lock(mutex);
    return work.empty() && running == 0 ? State::idle : State::busy;
  }
  void destroy() noexcept override {
    ++destroyed;
    if (!is_lost) run_all();  // the runtime finishes a live stream's work
  }
  void run_all() {
    std::unique_lock lock(mutex);
    while (!work.empty()) {
      auto op = std::move(work.front());
      work.pop_front();
      ++running;
      lock.unlock();
      op();
      lock.lock();
      --running;
    }
  }

  std::mutex mutex;
  std::deque<std::function<void()>> work;
  int running = 0;
  std::atomic<bool> fail_copy{false};
  std::atomic<bool> fail_callback{false};
  std::atomic<bool> is_lost{false};
  std::atomic<int> wait_result{0};
  std::atomic<int> waits{0};
  std::atomic<int> queries{0};
  int destroyed = 0;
};

struct Counter {
  std::atomic<int> fired{0};
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
  EXPECT_EQ(releases.wait_until_over(), 0);
  EXPECT_EQ(counter.fired, 1);
}

// A stream that reports an error of its own (a CUDA sticky error) runs no
// callback again: the kit fires what is owed. ROCm reports no such state
// (docs/plugins/hip.md); this is the kit's side of the rule.
TEST(StreamReleases, WaitFailsAndTheStreamIsLost_EveryOwedReleaseFiresOnce) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  std::deque<Counter> counters(3);
  for (auto& c : counters) releases.copy_until_released(0, nullptr, 1, c.release());
  stream.wait_result = kFailed;
  stream.is_lost = true;
  EXPECT_EQ(releases.wait_until_over(), kFailed);
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

// Waits that keep failing while the stream still runs (not lost) do not
// end the wait: the release of a copy whose callback could not be queued
// fires, and the call returns, only once the stream ran the copy.
TEST(StreamReleases, CallbackCannotBeQueuedAndWaitsKeepFailing_ReturnsOnlyOnceTheStreamRan) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter counter;
  stream.fail_callback = true;
  stream.wait_result = kFailed;
  std::atomic<bool> returned{false};
  StreamReleases::Submitted submitted;
  std::thread caller([&] {
    submitted = releases.copy_until_released(0, nullptr, 1, counter.release());
    returned = true;
  });
  // Far more failed waits than a bounded retry would make.
  while (stream.waits < 10 && !returned) std::this_thread::yield();
  EXPECT_FALSE(returned) << "returned while the copy was still queued";
  EXPECT_EQ(counter.fired, 0) << "released while the copy was still queued";
  EXPECT_GT(stream.queries, 0);
  stream.run_all();
  caller.join();
  EXPECT_EQ(submitted.released, kOutOfMemory);
  EXPECT_EQ(counter.fired, 1);
}

// A wait (synchronize) that fails while the stream still runs neither fires
// a release nor returns: when it returns, every release has come from the
// stream's own callbacks (PLUGIN-20, whatever the status).
TEST(StreamReleases, WaitFailsWhileTheStreamIsBusy_NoReleaseFires_ReturnsTheFailureOnceIdle) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter counter;
  releases.copy_until_released(0, nullptr, 1, counter.release());
  stream.wait_result = kFailed;
  std::atomic<int> result{-1};
  std::thread waiter([&] { result = releases.wait_until_over(); });
  while (stream.waits < 10 && result == -1) std::this_thread::yield();
  EXPECT_EQ(result, -1) << "wait_until_over returned while the stream was busy";
  EXPECT_EQ(counter.fired, 0);
  stream.run_all();
  waiter.join();
  EXPECT_EQ(result, kFailed);
  EXPECT_EQ(counter.fired, 1);  // by its own callback
}

TEST(StreamReleases, WaitUntilOver_StreamLostWhileWaitsFail_FiresWhatIsOwedAndReturns) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  std::deque<Counter> counters(2);
  for (auto& c : counters) releases.copy_until_released(0, nullptr, 1, c.release());
  stream.wait_result = kFailed;
  std::atomic<int> result{-1};
  std::thread waiter([&] { result = releases.wait_until_over(); });
  while (stream.waits < 3 && result == -1) std::this_thread::yield();
  EXPECT_EQ(result, -1);
  stream.is_lost = true;
  waiter.join();
  EXPECT_EQ(result, kFailed);
  for (const auto& c : counters) EXPECT_EQ(c.fired, 1);
  releases.quiesce(true);
  for (const auto& c : counters) EXPECT_EQ(c.fired, 1);
}

// destroy: the stream's copies still run while its waits fail; their
// releases come after them, and destroy does not return before.
TEST(StreamReleases, QuiesceWhileWaitsFailOnABusyStream_WaitsUntilTheStreamRan) {
  ScriptedStream stream;
  StreamReleases releases(stream);
  Counter counter;
  releases.copy_until_released(0, nullptr, 1, counter.release());
  stream.wait_result = kFailed;
  std::atomic<bool> returned{false};
  std::thread destroyer([&] {
    releases.quiesce(true);
    returned = true;
  });
  while (stream.waits < 10 && !returned) std::this_thread::yield();
  EXPECT_FALSE(returned);
  EXPECT_EQ(counter.fired, 0);
  EXPECT_EQ(stream.destroyed, 0) << "destroyed while its work was still queued";
  stream.run_all();
  destroyer.join();
  EXPECT_EQ(counter.fired, 1);
  EXPECT_EQ(stream.destroyed, 1);
}

// With a bound of two callbacks per wait: the third copy first waits for
// the stream (whose callbacks release the first two), then is queued.
TEST(StreamReleases, CallbacksPerWaitReached_WaitsForTheStreamBeforeQueuingMore) {
  ScriptedStream stream;
  StreamReleases releases(stream, 2);
  std::deque<Counter> counters(5);
  for (int i = 0; i < 2; ++i) releases.copy_until_released(0, nullptr, 1, counters[i].release());
  EXPECT_EQ(stream.waits, 0);
  const auto third = releases.copy_until_released(0, nullptr, 1, counters[2].release());
  EXPECT_EQ(third.waited, 0);
  EXPECT_EQ(stream.waits, 1);
  EXPECT_EQ(counters[0].fired, 1);
  EXPECT_EQ(counters[1].fired, 1);
  EXPECT_EQ(counters[2].fired, 0) << "queued after the wait, released by its own callback";
  releases.copy_until_released(0, nullptr, 1, counters[3].release());
  EXPECT_EQ(stream.waits, 1);
  releases.copy_until_released(0, nullptr, 1, counters[4].release());
  EXPECT_EQ(stream.waits, 2);
  EXPECT_EQ(releases.wait_until_over(), 0);
  for (const auto& c : counters) EXPECT_EQ(c.fired, 1);
}

// PLUGIN-14: no release fires under a lock the host could need. The wait
// the bound makes holds the submission lock (nothing may be queued during
// it), and the stream runs its callbacks meanwhile: the releases they
// complete fire once that lock is let go, before the call returns, so an
// on_release that waits for another thread's copy on the same stream does
// not deadlock. Each release here checks from another thread whether the
// submission lock can be taken while it runs.
TEST(StreamReleases, CallbacksPerWaitReached_ReleasesTheWaitCompletesFireOutsideTheSubmissionLock) {
  ScriptedStream stream;
  StreamReleases releases(stream, 2);
  struct Probe {
    StreamReleases* releases = nullptr;
    std::atomic<int> fired{0};
    std::atomic<int> under_lock{0};
    std::atomic<bool> took{false};
    std::thread other;  // joined by the test: it waits while the lock is held
    static void on_release(void* self) {
      auto* p = static_cast<Probe*>(self);
      ++p->fired;
      p->other = std::thread([p] {
        (void)p->releases->submit([] { return 0; });
        p->took = true;
      });
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (!p->took && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!p->took) ++p->under_lock;
    }
  };
  std::deque<Probe> probes(3);
  for (Probe& p : probes) p.releases = &releases;
  for (int i = 0; i < 2; ++i) {
    releases.copy_until_released(0, nullptr, 1, Release(&Probe::on_release, &probes[i]));
  }
  EXPECT_EQ(probes[0].fired, 0);
  // The third copy reaches the bound: its wait runs the first two callbacks.
  releases.copy_until_released(0, nullptr, 1, Release(&Probe::on_release, &probes[2]));
  EXPECT_EQ(stream.waits, 1);
  EXPECT_EQ(probes[0].fired, 1) << "completed by the wait, fired before the call returned";
  EXPECT_EQ(probes[1].fired, 1);
  EXPECT_EQ(probes[0].under_lock, 0) << "fired under the submission lock";
  EXPECT_EQ(probes[1].under_lock, 0) << "fired under the submission lock";
  EXPECT_EQ(probes[2].fired, 0);
  EXPECT_EQ(releases.wait_until_over(), 0);
  EXPECT_EQ(probes[2].fired, 1);
  for (Probe& p : probes) p.other.join();
}

// While the bound's wait holds the completions of the callbacks it ran, a
// synchronize on another thread (wait_until_over) still returns with every
// release it covered fired: it fires those held itself.
TEST(StreamReleases, CompletionsHeldByTheBoundsWait_ASynchronizeOnAnotherThreadFiresThem) {
  ScriptedStream stream;
  StreamReleases releases(stream, 1);
  Counter first, second;
  releases.copy_until_released(0, nullptr, 1, first.release());
  // Behind the first copy and its callback: work that runs until the test
  // lets it end, so that the bound's wait below stays in it.
  std::mutex gate_mutex;
  std::condition_variable gate_changed;
  bool in_work = false;
  bool open = false;
  {
    std::lock_guard lock(stream.mutex);
    stream.work.push_back([&] {
      std::unique_lock gate(gate_mutex);
      in_work = true;
      gate_changed.notify_all();
      gate_changed.wait(gate, [&] { return open; });
    });
  }
  std::thread bound([&] { releases.copy_until_released(0, nullptr, 1, second.release()); });
  {
    std::unique_lock gate(gate_mutex);
    gate_changed.wait(gate, [&] { return in_work; });
  }
  // The first callback ran inside the bound's wait, which still holds the
  // submission lock: its release is held, not fired.
  EXPECT_EQ(first.fired, 0);
  EXPECT_EQ(releases.wait_until_over(), 0);  // the stream has nothing left to run
  EXPECT_EQ(first.fired, 1) << "synchronize returned with a release it covered unfired";
  {
    std::lock_guard gate(gate_mutex);
    open = true;
  }
  gate_changed.notify_all();
  bound.join();
  EXPECT_EQ(releases.wait_until_over(), 0);
  EXPECT_EQ(first.fired, 1);
  EXPECT_EQ(second.fired, 1);
}

// The wait the bound makes fails (the stream idle, not lost): the copy is
// not queued, its release fires before the call returns, the result says so.
TEST(StreamReleases, CallbacksPerWaitReachedAndTheWaitFails_NothingQueued_ReleaseFires) {
  ScriptedStream stream;
  StreamReleases releases(stream, 1);
  Counter first, second;
  releases.copy_until_released(0, nullptr, 1, first.release());
  stream.run_all();  // idle from now on
  stream.wait_result = kFailed;
  const auto submitted = releases.copy_until_released(0, nullptr, 1, second.release());
  EXPECT_EQ(submitted.waited, kFailed);
  EXPECT_EQ(second.fired, 1);
  {
    std::lock_guard lock(stream.mutex);
    EXPECT_TRUE(stream.work.empty()) << "queued although the bound's wait failed";
  }
  EXPECT_EQ(first.fired, 1);
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

// A release that a stream's callback thread took before destroy counts
// until its on_release returned, also when the runtime cannot be reached
// (quiesce(false) waits for nothing on the stream): the host may free the
// release's user_data once destroy returned.
TEST(StreamReleases, QuiesceWhileACallbackFiresARelease_ReturnsOnlyAfterItReturned) {
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
  ScriptedStream stream;
  StreamReleases releases(stream);
  releases.copy_until_released(0, nullptr, 1, Release(&Gate::on_release, &gate));
  std::thread callback([&] { stream.run_all(); });
  {
    std::unique_lock lock(gate.mutex);
    gate.changed.wait(lock, [&] { return gate.entered; });
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard lock(gate.mutex);
    gate.open = true;
    gate.changed.notify_all();
  });
  releases.quiesce(false);
  EXPECT_TRUE(gate.returned) << "quiesce returned while a callback was still firing a release";
  EXPECT_EQ(stream.destroyed, 1);
  opener.join();
  callback.join();
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

// A release taken back (its copy or callback could not be queued) is owed
// by the queue no more: a wait_for_earlier blocked on it returns.
TEST(ReleaseQueue, WaitForEarlier_ReturnsOnceTheReleaseItWaitsForIsTakenBack) {
  ReleaseQueue queue;
  Counter counter;
  const uint64_t ticket = queue.push(counter.release());
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    queue.wait_for_earlier();
    returned = true;
  });
  // Lets the waiter block first; had it not yet, it returns at once.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Release taken = queue.take_back(ticket);
  EXPECT_TRUE(static_cast<bool>(taken));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!returned && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_TRUE(returned) << "wait_for_earlier still waits for a release taken back";
  if (!returned) {
    // Wakes it (a later release fired) so that the test ends.
    queue.push(Release{});
    queue.complete_oldest();
  }
  waiter.join();
  taken.fire();
  EXPECT_EQ(counter.fired, 1);
}

}  // namespace
}  // namespace devalloc::plugin
