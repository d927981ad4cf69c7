// The kit's release holders when the host runs out of memory while a
// release is being queued: the release fires (nothing was submitted), once,
// and outside the holder's lock (PLUGIN-14), so that a release may call
// back into the plugin. This program replaces the global operator new so
// that the next allocation of one thread can be made to fail; it is inert
// until a test arms it.
#include <devalloc/plugin_kit/completion_thread.hpp>
#include <devalloc/plugin_kit/release_queue.hpp>
#include <devalloc/plugin_kit/stream_releases.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <new>
#include <thread>

namespace {

thread_local int fail_next_allocations = 0;

}  // namespace

// GCC sees the malloc below through the inlined operator delete's free and
// calls them mismatched; they are the pair this program defines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t size) {
  if (fail_next_allocations > 0) {
    --fail_next_allocations;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace devalloc::plugin {
namespace {

using namespace std::chrono_literals;

// Whether `probe` (a call that takes the holder's lock) could run on
// another thread while the release fired: false if it was still blocked
// after a second, that is, if the release fired under the lock.
struct LockProbe {
  template <class Probe>
  void check_from_release(Probe probe) {
    ++fired;
    auto done = std::async(std::launch::async, probe);
    free_to_lock = done.wait_for(1s) == std::future_status::ready;
    // If blocked, the probe finishes once the holder unlocks; the future's
    // destructor waits for it after this release returned.
    pending = std::move(done);
  }
  int fired = 0;
  bool free_to_lock = false;
  std::future<void> pending;
};

// A push allocates only now and then (a deque grows by blocks), so each
// try queues `earlier` empty entries first, one more each time, until the
// push of the probing release is one that allocates.
constexpr int kMostEarlier = 200;

TEST(ReleaseQueueOutOfMemory, GivenPushFailsToAllocate_ThenTheReleaseFiresOnceOutsideTheLock) {
  bool threw = false;
  for (int earlier = 0; earlier < kMostEarlier && !threw; ++earlier) {
    ReleaseQueue queue;
    LockProbe probe;
    struct Context {
      ReleaseQueue* queue;
      LockProbe* probe;
    } context{&queue, &probe};
    for (int i = 0; i < earlier; ++i) queue.push(Release());
    fail_next_allocations = 1;
    try {
      queue.push(Release(
          [](void* user_data) {
            auto* c = static_cast<Context*>(user_data);
            c->probe->check_from_release([q = c->queue] { (void)q->pending(); });
          },
          &context));
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool allocated = fail_next_allocations == 0;
    fail_next_allocations = 0;
    if (!threw) {
      EXPECT_FALSE(allocated) << "an allocation failed but push did not throw";
      queue.fire_all();  // the probe's release, outside the lock
      EXPECT_EQ(probe.fired, 1);
      continue;
    }
    EXPECT_EQ(probe.fired, 1);
    EXPECT_TRUE(probe.free_to_lock) << "the release fired under the queue's lock";
    EXPECT_EQ(queue.pending(), static_cast<size_t>(earlier));
    // The queue still works: the next push completes after the earlier ones.
    int later = 0;
    queue.push(Release([](void* p) { ++*static_cast<int*>(p); }, &later));
    queue.fire_all();
    EXPECT_EQ(later, 1);
  }
  EXPECT_TRUE(threw) << "no push allocated";
}

TEST(CompletionThreadOutOfMemory, GivenPushFailsToAllocate_ThenTheReleaseFiresOnceOutsideTheLock) {
  bool threw = false;
  for (int earlier = 0; earlier < kMostEarlier && !threw; ++earlier) {
    CompletionThread thread;
    LockProbe probe;
    struct Context {
      CompletionThread* thread;
      LockProbe* probe;
    } context{&thread, &probe};
    // The worker waits in a first job, so that the queue holds what follows.
    std::promise<void> go;
    std::shared_future<void> started = go.get_future().share();
    thread.push([started] { started.wait(); }, Release());
    for (int i = 0; i < earlier; ++i) thread.push([] {}, Release());
    bool ran = false;
    // Built before arming, so that the failing allocation is the queue's.
    CompletionThread::Complete complete = [&ran] { ran = true; };
    fail_next_allocations = 1;
    try {
      thread.push(std::move(complete),
                  Release(
                      [](void* user_data) {
                        auto* c = static_cast<Context*>(user_data);
                        c->probe->check_from_release([t = c->thread] { (void)t->take_error(); });
                      },
                      &context));
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool allocated = fail_next_allocations == 0;
    fail_next_allocations = 0;
    go.set_value();
    thread.wait_for_earlier();
    EXPECT_EQ(probe.fired, 1);
    if (!threw) {
      EXPECT_FALSE(allocated) << "an allocation failed but push did not throw";
      EXPECT_TRUE(ran);
      continue;
    }
    EXPECT_TRUE(probe.free_to_lock) << "the release fired under the worker's lock";
    EXPECT_FALSE(ran);
    int later = 0;
    thread.push([] {}, Release([](void* p) { ++*static_cast<int*>(p); }, &later));
    thread.wait_for_earlier();
    EXPECT_EQ(later, 1);
    EXPECT_FALSE(thread.take_error().has_value());
  }
  EXPECT_TRUE(threw) << "no push allocated";
}

// A stream whose copies and callbacks are queued and never run (their
// releases stay owed until the StreamReleases ends).
class IdleStream : public CallbackStream {
 public:
  int enqueue_copy(uint64_t, const void*, uint64_t) noexcept override { return 0; }
  int enqueue_release(ReleaseQueue&) noexcept override { return 0; }
  int wait() noexcept override { return 0; }
  State query() noexcept override { return State::idle; }
  void destroy() noexcept override {}
};

// StreamReleases holds its submission lock around the push into its queue
// (with bounded callbacks): the release of a push that runs out of memory
// must fire after that lock is let go too, not only the queue's.
TEST(StreamReleasesOutOfMemory, GivenPushFailsToAllocate_ThenTheReleaseFiresOnceOutsideTheSubmissionLock) {
  bool threw = false;
  for (int earlier = 0; earlier < kMostEarlier && !threw; ++earlier) {
    IdleStream stream;
    LockProbe probe;
    {
      StreamReleases releases(stream, /*callbacks_per_wait=*/1000);
      struct Context {
        StreamReleases* releases;
        LockProbe* probe;
      } context{&releases, &probe};
      for (int i = 0; i < earlier; ++i) releases.copy_until_released(0, nullptr, 0, Release());
      Release probing(
          [](void* user_data) {
            auto* c = static_cast<Context*>(user_data);
            // submit takes the submission lock when callbacks are bounded.
            c->probe->check_from_release([r = c->releases] { (void)r->submit([] { return 0; }); });
          },
          &context);
      fail_next_allocations = 1;
      try {
        releases.copy_until_released(0, nullptr, 0, std::move(probing));
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      fail_next_allocations = 0;
      if (threw) {
        EXPECT_EQ(probe.fired, 1);
        EXPECT_TRUE(probe.free_to_lock) << "the release fired under the submission lock";
      }
    }  // the owed releases fire
    EXPECT_EQ(probe.fired, 1);
  }
  EXPECT_TRUE(threw) << "no push allocated";
}

}  // namespace
}  // namespace devalloc::plugin
