// Releases and destroy paths when the driver misbehaves (issue 10, defects 4
// and 5) and copies from the plugin's own pinned memory: a release fires
// exactly once and never before its copy has read the source, whatever
// fails; destroy never leaves a stream behind; no device memory is lost
// when the plugin's bookkeeping fails.
#include "cuda_fixture.hpp"

#include <cstdlib>
#include <deque>
#include <functional>
#include <new>
#include <thread>

namespace {
// The next allocation on this thread throws bad_alloc: armed by a hook the
// fake driver runs just before cuMemAlloc_v2 returns, so that the plugin's
// first allocation after the driver's is the one that fails.
thread_local int fail_next_allocations = 0;
void fail_next_allocation() { fail_next_allocations = 1; }
}  // namespace

void* operator new(size_t size) {
  if (fail_next_allocations > 0) {
    --fail_next_allocations;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// The matching deletes, so that a sanitizer sees malloc paired with free.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace devalloc::cuda_test {
namespace {

constexpr uint32_t kDevice = 0;
constexpr size_t kChunk = 64 * 1024;

// Records, at the moment of its release, whether the copy had landed.
struct LandedAtRelease {
  const FakeCuda* fake = nullptr;
  uint64_t dst = 0;
  std::vector<uint8_t> expected;
  std::atomic<int> releases{0};
  std::atomic<int> early{0};
  static void on_release(void* self) {
    auto* me = static_cast<LandedAtRelease*>(self);
    if (me->fake->read(me->dst, me->expected.size()) != me->expected) me->early.fetch_add(1);
    me->releases.fetch_add(1);
  }
};

class CudaReleases : public CudaPluginTest {
 protected:
  static constexpr int kCopies = 4;

  // kCopies until-released copies of their own bytes into consecutive
  // chunks of one allocation, issued while the stream is paused: none has
  // run when this returns (the stream stays paused).
  struct PausedCopies {
    uint64_t base = 0;
    std::vector<std::vector<uint8_t>> sources;
    std::deque<LandedAtRelease> watchers;
  };
  void issue_paused(PausedCopies& copies) {
    Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
    ASSERT_TRUE(base.ok());
    copies.base = *base;
    copies.watchers.resize(kCopies);
    fake().pause(true);
    for (int i = 0; i < kCopies; ++i) {
      copies.sources.push_back(pattern(kChunk, i));
      LandedAtRelease& watcher = copies.watchers[i];
      watcher.fake = &fake();
      watcher.dst = *base + i * kChunk;
      watcher.expected = copies.sources[i];
      ASSERT_TRUE(plugin()
                      .copy_to_device_until_released(kDevice, watcher.dst,
                                                     copies.sources[i].data(), kChunk,
                                                     LandedAtRelease::on_release, &watcher)
                      .ok());
    }
  }
  static void expect_released_once_each_after_its_copy(const PausedCopies& copies) {
    for (int i = 0; i < kCopies; ++i) {
      EXPECT_EQ(copies.watchers[i].releases, 1) << "copy " << i;
      EXPECT_EQ(copies.watchers[i].early, 0) << "copy " << i << " released before it landed";
    }
  }
  // Paused copies, every cuStreamSynchronize failing, then `arm()`: a
  // synchronize on another thread returns (with the failure) only once the
  // stream ran the copies, and no release comes before its copy. Looked at
  // once `watched` was called `calls` times (or synchronize returned).
  void expect_failing_synchronize_waits_for_the_paused_copies(
      const char* watched, uint64_t calls, const std::function<void()>& arm = [] {}) {
    PausedCopies copies;
    ASSERT_NO_FATAL_FAILURE(issue_paused(copies));
    fake().fail_calls("cuStreamSynchronize", CUDA_ERROR_UNKNOWN, 1000);
    arm();
    std::atomic<bool> returned{false};
    Status failed;
    std::thread caller([&] {
      failed = plugin().synchronize(kDevice);
      returned = true;
    });
    while (fake().calls(watched) < calls && !returned) std::this_thread::yield();
    EXPECT_FALSE(returned) << "synchronize returned while the paused stream held the copies";
    // The stream is paused: no copy has run, so no source may be released.
    for (int i = 0; i < kCopies; ++i) {
      EXPECT_EQ(copies.watchers[i].releases, 0) << "copy " << i << " released before it ran";
    }
    fake().pause(false);
    caller.join();
    fake().fail_calls("cuStreamSynchronize", 0, 0);
    EXPECT_EQ(failed.code(), StatusCode::device_error);
    EXPECT_NE(failed.message().find("cuStreamSynchronize"), std::string::npos)
        << failed.message();
    expect_released_once_each_after_its_copy(copies);
    ASSERT_TRUE(plugin().synchronize(kDevice).ok());
    EXPECT_TRUE(plugin().deallocate(kDevice, copies.base).ok());
  }
};

// A failed cuStreamSynchronize on a stream that still runs (no sticky
// error) fires no release before its copy, and synchronize returns (with
// the failure) only once every release came (PLUGIN-20, whatever the
// status).
TEST_F(CudaReleases, StreamSynchronizeFailsWhileTheStreamStillRuns_ReturnsAfterEveryRelease) {
  expect_failing_synchronize_waits_for_the_paused_copies("cuStreamSynchronize", 6);
}

// cuStreamSynchronize keeps failing while the stream still holds the copy
// (cuStreamQuery: CUDA_ERROR_NOT_READY, no sticky error). A during-call copy
// must not return before the copy read its source: the caller rewrites the
// source right after the call, and the fake's source-lifetime check sees a
// copy that reads it later (the fake reads pageable sources late too).
TEST_F(CudaReleases, DuringCallCopyWhileStreamWaitsKeepFailing_ReturnsOnlyAfterTheCopyRead) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 11);
  const std::vector<uint8_t> expected = source;
  fake().pause(true);
  fake().fail_calls("cuStreamSynchronize", CUDA_ERROR_UNKNOWN, 1000);
  std::atomic<bool> returned{false};
  Status status;
  std::thread caller([&] {
    status = plugin().copy_to_device(kDevice, *base, source.data(), kChunk);
    returned = true;
    std::fill(source.begin(), source.end(), uint8_t{0xBB});  // the caller's again
  });
  // Twice as many failed waits as the plugin once gave up after.
  while (fake().calls("cuStreamSynchronize") < 6 && !returned) std::this_thread::yield();
  EXPECT_FALSE(returned) << "returned while the stream still held the copy";
  fake().pause(false);
  caller.join();
  fake().fail_calls("cuStreamSynchronize", 0, 0);
  EXPECT_EQ(status.code(), StatusCode::device_error);
  EXPECT_NE(status.message().find("cuStreamSynchronize"), std::string::npos) << status.message();
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// The same for a copy into pinned host memory: its destination is written
// before the call returns, not after.
TEST_F(CudaReleases, CopyToHostWhileStreamWaitsKeepFailing_ReturnsOnlyAfterTheCopyWrote) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> expected = pattern(kChunk, 12);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base, expected.data(), kChunk).ok());
  Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_TRUE(pinned.ok());
  auto* destination = static_cast<uint8_t*>(*pinned);
  std::fill(destination, destination + kChunk, uint8_t{0});
  fake().pause(true);
  fake().fail_calls("cuStreamSynchronize", CUDA_ERROR_UNKNOWN, 1000);
  std::atomic<bool> returned{false};
  std::vector<uint8_t> at_return;
  std::thread caller([&] {
    static_cast<void>(plugin().copy_to_host(kDevice, destination, *base, kChunk));
    at_return.assign(destination, destination + kChunk);
    returned = true;
  });
  while (fake().calls("cuStreamSynchronize") < 6 && !returned) std::this_thread::yield();
  EXPECT_FALSE(returned) << "returned while the stream still held the copy";
  fake().pause(false);
  caller.join();
  fake().fail_calls("cuStreamSynchronize", 0, 0);
  EXPECT_EQ(at_return, expected) << "the destination was not written when the call returned";
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// destroy while the waits keep failing: each release still follows its
// copy, and destroy returns only after the stream ran them.
TEST_F(CudaReleases, DestroyWhileStreamWaitsKeepFailing_EachReleaseFollowsItsCopy) {
  PausedCopies copies;
  ASSERT_NO_FATAL_FAILURE(issue_paused(copies));
  fake().fail_calls("cuStreamSynchronize", CUDA_ERROR_UNKNOWN, 1000);
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    destroy_plugin();
    destroyed = true;
  });
  while (fake().calls("cuStreamSynchronize") < 6 && !destroyed) std::this_thread::yield();
  EXPECT_FALSE(destroyed) << "destroy returned while the stream still held the copies";
  for (int i = 0; i < kCopies; ++i) EXPECT_EQ(copies.watchers[i].releases, 0) << "copy " << i;
  fake().pause(false);
  destroyer.join();
  fake().fail_calls("cuStreamSynchronize", 0, 0);
  expect_released_once_each_after_its_copy(copies);
}

// A failed wait, then one cuStreamQuery that fails too (not
// CUDA_ERROR_NOT_READY), on a context with no sticky error: one failed
// query is no lost context. The stream still holds the copies; no release
// may fire before its copy ran, and synchronize returns only once they ran.
TEST_F(CudaReleases, StreamQueryFailsOnceAfterAFailedWait_NoReleaseBeforeItsCopy) {
  // Past the failed query, and a few looks at the stream after it.
  expect_failing_synchronize_waits_for_the_paused_copies(
      "cuStreamQuery", 4, [&] { fake().fail_next("cuStreamQuery", CUDA_ERROR_UNKNOWN); });
}

TEST_F(CudaReleases, ContextPushFailsOnceAtDestroy_EachReleaseStillFollowsItsCopy) {
  PausedCopies copies;
  ASSERT_NO_FATAL_FAILURE(issue_paused(copies));
  fake().fail_next("cuCtxPushCurrent_v2", CUDA_ERROR_UNKNOWN);
  std::thread destroyer([this] { destroy_plugin(); });
  // Let the streams go once destroy waits for them, or once it released a
  // source without waiting (the defect).
  const auto any_released = [&] {
    for (const auto& w : copies.watchers) {
      if (w.releases > 0) return true;
    }
    return false;
  };
  while (fake().calls("cuStreamSynchronize") == 0 && !any_released()) std::this_thread::yield();
  fake().pause(false);
  destroyer.join();
  expect_released_once_each_after_its_copy(copies);
}

TEST_F(CudaReleases, ContextUnreachableAtDestroy_EveryStreamIsStillDestroyed) {
  const uint64_t devices = plugin().devices().size();
  fake().fail_calls("cuCtxPushCurrent_v2", CUDA_ERROR_UNKNOWN, 1000);
  destroy_plugin();
  fake().fail_calls("cuCtxPushCurrent_v2", 0, 0);
  EXPECT_EQ(fake().calls("cuStreamDestroy_v2"), devices);
}

TEST_F(CudaReleases, FreeFails_AllocationStaysTrackedAndCanBeFreedAgain) {
  Result<uint64_t> address = plugin().allocate(kDevice, kChunk, 4096);
  ASSERT_TRUE(address.ok());
  fake().fail_next("cuMemFree_v2", CUDA_ERROR_UNKNOWN);
  const Status failed = plugin().deallocate(kDevice, *address);
  EXPECT_EQ(failed.code(), StatusCode::device_error);
  EXPECT_NE(failed.message().find("cuMemFree_v2(dptr = 0x"), std::string::npos)
      << failed.message();
  EXPECT_EQ(fake().live_allocations(kDevice), 1u);
  EXPECT_TRUE(plugin().deallocate(kDevice, *address).ok());
  EXPECT_EQ(fake().live_allocations(kDevice), 0u);
}

TEST_F(CudaReleases, OutOfHostMemoryRightAfterCuMemAlloc_DeviceAllocationIsFreed) {
  fake().after_next("cuMemAlloc_v2", fail_next_allocation);
  const Result<uint64_t> address = plugin().allocate(kDevice, kChunk, 0);
  fail_next_allocations = 0;
  EXPECT_EQ(address.status().code(), StatusCode::out_of_host_memory)
      << address.status().message();
  EXPECT_EQ(fake().calls("cuMemAlloc_v2"), 1u);
  EXPECT_EQ(fake().calls("cuMemFree_v2"), 1u);
  EXPECT_EQ(fake().live_allocations(-1), 0u);
}

TEST_F(CudaReleases,
       UntilReleasedCopyFromPinnedStaging_ReturnsBeforeTheStreamRanIt_ReleasedAfter) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> zeros(kChunk, 0);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base, zeros.data(), kChunk).ok());
  Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_TRUE(pinned.ok()) << pinned.status().message();
  auto* staging = static_cast<uint8_t*>(*pinned);
  const std::vector<uint8_t> expected = pattern(kChunk, 9);
  std::copy(expected.begin(), expected.end(), staging);
  ReleaseCounter counter;
  const uint64_t waits = fake().calls("cuStreamSynchronize");
  fake().pause(true);
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, staging, kChunk,
                                                 ReleaseCounter::on_release, &counter)
                  .ok());
  // Returned while the stream holds the copy: nothing waited, nothing
  // landed, nothing released.
  EXPECT_EQ(fake().calls("cuStreamSynchronize"), waits);
  EXPECT_EQ(fake().read(*base, kChunk), zeros);
  EXPECT_EQ(counter.releases, 0);
  fake().pause(false);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, 1);
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

}  // namespace
}  // namespace devalloc::cuda_test
