// The HIP plugin through the real loader against the fake HIP runtime:
// devices and errors, the caller's current device, releases after stream
// callbacks, HIP's synchronous pageable copies, planted misuse.
#include "hip_fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace devalloc::hip_test {
namespace {

using fake_test::pattern;
using fake_test::ReleaseCounter;

constexpr size_t kChunk = 64 * 1024;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class HipPluginTest : public fake_test::PluginWithFake<FakeHip> {
 protected:
  HipPluginTest() : PluginWithFake(kPlugin, kFake) {}

  // The calling thread's current device, as the application sees it.
  int current_device() const {
    int device = -1;
    EXPECT_EQ(fake().get<hipError_t (*)(int*)>("hipGetDevice")(&device), hipSuccess);
    return device;
  }
  void set_current_device(int device) const {
    EXPECT_EQ(fake().get<hipError_t (*)(int)>("hipSetDevice")(device), hipSuccess);
  }

  // An until-released copy of `expected` (kChunk bytes) from pinned staging
  // to a fresh allocation, issued while the stream is paused: it has not
  // run when this returns (the stream stays paused).
  struct PausedCopy {
    uint64_t base = 0;
    void* pinned = nullptr;
    std::vector<uint8_t> expected;
  };
  PausedCopy paused_copy(uint8_t seed, ReleaseCounter& counter) {
    PausedCopy copy;
    Result<uint64_t> base = plugin().allocate(0, kChunk, 0);
    EXPECT_TRUE(base.ok()) << base.status().message();
    Result<void*> pinned = plugin().allocate_host(kChunk);
    EXPECT_TRUE(pinned.ok()) << pinned.status().message();
    if (!base.ok() || !pinned.ok()) return copy;
    copy.base = *base;
    copy.pinned = *pinned;
    copy.expected = pattern(kChunk, seed);
    std::copy(copy.expected.begin(), copy.expected.end(), static_cast<uint8_t*>(copy.pinned));
    fake().pause(true);
    EXPECT_TRUE(plugin()
                    .copy_to_device_until_released(0, copy.base, copy.pinned, kChunk,
                                                   ReleaseCounter::on_release, &counter)
                    .ok());
    return copy;
  }
  // Lets the stream run: synchronize releases the copy once, its bytes
  // landed, and its memory is freed.
  void resume_and_check(const PausedCopy& copy, const ReleaseCounter& counter) {
    fake().pause(false);
    ASSERT_TRUE(plugin().synchronize(0).ok());
    EXPECT_EQ(counter.releases, 1);
    EXPECT_EQ(fake().read(copy.base, kChunk), copy.expected);
    EXPECT_TRUE(plugin().free_host(copy.pinned).ok());
    EXPECT_TRUE(plugin().deallocate(0, copy.base).ok());
  }
};

TEST(HipRuntime, NoRuntimeAtThePath_CreateIsRuntimeUnavailableNamingTheFile) {
  auto [plugin, error] = load_hip("/nonexistent/libamdhip64.so.5");
  ASSERT_FALSE(plugin);
  EXPECT_EQ(error.status.code(), StatusCode::runtime_unavailable);
  EXPECT_TRUE(contains(error.status.message(),
                       "hip: cannot open the HIP runtime \"/nonexistent/libamdhip64.so.5\""))
      << error.status.message();
}

TEST_F(HipPluginTest, Devices_ComeFromNameUuidAndPciQueries_AsRocmDevices) {
  const auto& devices = plugin().devices();
  ASSERT_EQ(devices.size(), 2u);
  for (const DeviceInfo& device : devices) {
    EXPECT_EQ(device.name, "Fake HIP Device " + std::to_string(device.index));
    EXPECT_EQ(device.total_memory_bytes, uint64_t{1} << 30);
    EXPECT_TRUE(device.has_uuid());
    EXPECT_EQ(device.pci_bus_id, device.index == 0 ? "0000:43:00.0" : "0000:44:00.0");
    EXPECT_EQ(device.dlpack_device_type, DEVALLOC_DLPACK_ROCM);
  }
}

TEST_F(HipPluginTest, AllocationBeyondDeviceMemory_NamesHipMallocAndHipGetErrorName) {
  const Result<uint64_t> address = plugin().allocate(1, uint64_t{2} << 30, 0);
  EXPECT_EQ(address.status().code(), StatusCode::out_of_device_memory);
  EXPECT_TRUE(contains(address.status().message(),
                       "hipMalloc(size = 2147483648) on device 1 failed: hipErrorOutOfMemory "
                       "(out of memory)"))
      << address.status().message();
}

// Pinned staging that HIP cannot give for lack of memory is host memory
// that ran out, as docs/plugins/hip.md says, not a device error.
TEST_F(HipPluginTest, PinnedAllocationOutOfMemory_IsOutOfHostMemoryNamingHipHostMalloc) {
  fake().fail_next("hipHostMalloc", hipErrorOutOfMemory);
  const Result<void*> pinned = plugin().allocate_host(kChunk);
  EXPECT_EQ(pinned.status().code(), StatusCode::out_of_host_memory);
  EXPECT_TRUE(contains(pinned.status().message(),
                       "hipHostMalloc(size = 65536, flags = hipHostMallocPortable) failed: "
                       "hipErrorOutOfMemory"))
      << pinned.status().message();
}

// A runtime that answers hipSuccess without memory (a NULL pointer): the
// plugin hands out no address 0 and no NULL staging buffer, but fails
// naming the call, and keeps nothing to free at destroy.
TEST_F(HipPluginTest, AllocationAnsweredSuccessWithoutMemory_IsADeviceErrorNamingTheCall) {
  fake().null_result_next("hipMalloc");
  const Result<uint64_t> address = plugin().allocate(1, 4096, 0);
  ASSERT_FALSE(address.ok()) << "handed out address 0x" << std::hex << *address;
  EXPECT_EQ(address.status().code(), StatusCode::device_error);
  EXPECT_TRUE(contains(address.status().message(),
                       "hipMalloc(size = 4096) on device 1 returned hipSuccess without memory "
                       "(a null pointer)"))
      << address.status().message();

  fake().null_result_next("hipHostMalloc");
  const Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_FALSE(pinned.ok());
  EXPECT_EQ(pinned.status().code(), StatusCode::device_error);
  EXPECT_TRUE(contains(pinned.status().message(),
                       "hipHostMalloc(size = 65536, flags = hipHostMallocPortable) returned "
                       "hipSuccess without memory (a null pointer)"))
      << pinned.status().message();

  destroy_plugin();
  EXPECT_EQ(fake().calls("hipFree"), 0u);
  EXPECT_EQ(fake().calls("hipHostFree"), 0u);
}

TEST_F(HipPluginTest, CallerHasDevice1Current_CallsOnDevice0LandThereAndDevice1StaysCurrent) {
  set_current_device(1);
  Result<uint64_t> base = plugin().allocate(0, kChunk, 4096);
  ASSERT_TRUE(base.ok()) << base.status().message();
  EXPECT_EQ(*base % 4096, 0u);
  EXPECT_EQ(fake().live_allocations(0), 1u);
  const auto bytes = pattern(kChunk, 1);
  ASSERT_TRUE(plugin().copy_to_device(0, *base, bytes.data(), kChunk).ok());
  ASSERT_TRUE(plugin().synchronize(0).ok());
  EXPECT_EQ(fake().read(*base, kChunk), bytes);
  EXPECT_EQ(current_device(), 1);
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
  EXPECT_EQ(current_device(), 1);
  set_current_device(0);
}

TEST_F(HipPluginTest, UntilReleasedCopyFromPinnedStaging_ReleasedOnlyAfterTheStreamRanIt) {
  ReleaseCounter counter;
  const PausedCopy copy = paused_copy(2, counter);
  ASSERT_NE(copy.pinned, nullptr);
  EXPECT_EQ(counter.releases, 0);
  resume_and_check(copy, counter);
}

TEST_F(HipPluginTest, PinnedSourceChangedBeforeItsRelease_FakeReportsTheChangedSource) {
  Result<uint64_t> base = plugin().allocate(0, kChunk, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_TRUE(pinned.ok());
  auto* source = static_cast<uint8_t*>(*pinned);
  std::fill(source, source + kChunk, uint8_t{7});
  ReleaseCounter counter;
  fake().pause(true);
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(0, *base, source, kChunk,
                                                 ReleaseCounter::on_release, &counter)
                  .ok());
  source[kChunk / 2] ^= 0xff;  // the planted misuse: before its release
  fake().pause(false);
  ASSERT_TRUE(plugin().synchronize(0).ok());
  EXPECT_EQ(counter.releases, 1);
  EXPECT_TRUE(contains(fake().violations(), "source of async copy changed before the copy read it"))
      << fake().violations();
  fake().reset();
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
}

TEST_F(HipPluginTest, CallbackCannotBeQueued_ReleasedOnceAfterTheCopy_ErrorNamesTheCall) {
  Result<uint64_t> base = plugin().allocate(0, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const auto bytes = pattern(kChunk, 3);
  ReleaseCounter counter;
  fake().fail_next("hipStreamAddCallback", hipErrorOutOfMemory);
  const Status status = plugin().copy_to_device_until_released(
      0, *base, bytes.data(), kChunk, ReleaseCounter::on_release, &counter);
  EXPECT_EQ(status.code(), StatusCode::device_error);
  EXPECT_TRUE(contains(status.message(), "hipStreamAddCallback")) << status.message();
  EXPECT_EQ(counter.releases, 1);
  EXPECT_EQ(fake().read(*base, kChunk), bytes);
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
}

// A failed hipStreamSynchronize on a stream that still runs (hipStreamQuery:
// hipErrorNotReady) is not a lost stream: the copy may still read its
// source, so its release waits for the stream's callback, and synchronize
// returns (with the failure) only once that release came (PLUGIN-20,
// whatever the status).
TEST_F(HipPluginTest, SynchronizeFailsWhileTheStreamStillRuns_ReturnsOnlyAfterTheRelease) {
  ReleaseCounter counter;
  const PausedCopy copy = paused_copy(4, counter);
  ASSERT_NE(copy.pinned, nullptr);
  fake().fail_calls("hipStreamSynchronize", hipErrorUnknown, 1000);
  std::atomic<bool> returned{false};
  Status failed;
  std::thread caller([&] {
    failed = plugin().synchronize(0);
    returned = true;
  });
  while (fake().calls("hipStreamSynchronize") < 6 && !returned) std::this_thread::yield();
  EXPECT_FALSE(returned) << "synchronize returned while the paused stream held the copy";
  EXPECT_EQ(counter.releases, 0) << "released while the paused stream had not run the copy";
  fake().pause(false);
  caller.join();
  fake().fail_calls("hipStreamSynchronize", 0, 0);
  EXPECT_EQ(failed.code(), StatusCode::device_error);
  EXPECT_TRUE(contains(failed.message(), "hipStreamSynchronize")) << failed.message();
  EXPECT_EQ(counter.releases, 1);
  resume_and_check(copy, counter);
}

// hipStreamSynchronize keeps failing while the stream still holds the copy
// (hipStreamQuery: hipErrorNotReady, not a lost stream). A during-call copy
// from pinned memory must not return before the copy read its source: the
// caller rewrites the source right after the call, and the fake's
// source-lifetime check sees a copy that reads it later.
TEST_F(HipPluginTest, DuringCallCopyWhileStreamWaitsKeepFailing_ReturnsOnlyAfterTheCopyRead) {
  Result<uint64_t> base = plugin().allocate(0, kChunk, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_TRUE(pinned.ok());
  auto* source = static_cast<uint8_t*>(*pinned);
  const auto expected = pattern(kChunk, 5);
  std::copy(expected.begin(), expected.end(), source);
  fake().pause(true);
  fake().fail_calls("hipStreamSynchronize", hipErrorUnknown, 1000);
  std::atomic<bool> returned{false};
  Status status;
  std::thread caller([&] {
    status = plugin().copy_to_device(0, *base, source, kChunk);
    returned = true;
    std::fill(source, source + kChunk, uint8_t{0xBB});  // the caller's again
  });
  // Twice as many failed waits as the plugin once gave up after.
  while (fake().calls("hipStreamSynchronize") < 6 && !returned) std::this_thread::yield();
  EXPECT_FALSE(returned) << "returned while the stream still held the copy";
  fake().pause(false);
  caller.join();
  fake().fail_calls("hipStreamSynchronize", 0, 0);
  EXPECT_EQ(status.code(), StatusCode::device_error);
  EXPECT_TRUE(contains(status.message(), "hipStreamSynchronize")) << status.message();
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
}

// The same for a copy to pinned host memory: its destination is written
// before the call returns, not after.
TEST_F(HipPluginTest, CopyToHostWhileStreamWaitsKeepFailing_ReturnsOnlyAfterTheCopyWrote) {
  Result<uint64_t> base = plugin().allocate(0, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const auto expected = pattern(kChunk, 6);
  ASSERT_TRUE(plugin().copy_to_device(0, *base, expected.data(), kChunk).ok());
  Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_TRUE(pinned.ok());
  auto* destination = static_cast<uint8_t*>(*pinned);
  std::fill(destination, destination + kChunk, uint8_t{0});
  fake().pause(true);
  fake().fail_calls("hipStreamSynchronize", hipErrorUnknown, 1000);
  std::atomic<bool> returned{false};
  std::vector<uint8_t> at_return;
  std::thread caller([&] {
    static_cast<void>(plugin().copy_to_host(0, destination, *base, kChunk));
    at_return.assign(destination, destination + kChunk);
    returned = true;
  });
  while (fake().calls("hipStreamSynchronize") < 6 && !returned) std::this_thread::yield();
  EXPECT_FALSE(returned) << "returned while the stream still held the copy";
  fake().pause(false);
  caller.join();
  fake().fail_calls("hipStreamSynchronize", 0, 0);
  EXPECT_EQ(at_return, expected) << "the destination was not written when the call returned";
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
}

// An until-released copy whose callback cannot be queued is released by the
// call itself, after the stream ran it, however often the waits fail.
TEST_F(HipPluginTest, CallbackCannotBeQueuedAndStreamWaitsKeepFailing_ReleasedOnlyAfterTheCopy) {
  ReleaseCounter counter;
  Result<uint64_t> base = plugin().allocate(0, kChunk, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_TRUE(pinned.ok());
  const auto expected = pattern(kChunk, 7);
  std::copy(expected.begin(), expected.end(), static_cast<uint8_t*>(*pinned));
  fake().pause(true);
  fake().fail_next("hipStreamAddCallback", hipErrorOutOfMemory);
  fake().fail_calls("hipStreamSynchronize", hipErrorUnknown, 1000);
  Status status;
  std::thread caller([&] {
    status = plugin().copy_to_device_until_released(0, *base, *pinned, kChunk,
                                                    ReleaseCounter::on_release, &counter);
  });
  while (fake().calls("hipStreamSynchronize") < 6 && counter.releases == 0) {
    std::this_thread::yield();
  }
  EXPECT_EQ(counter.releases, 0) << "released while the stream still held the copy";
  fake().pause(false);
  caller.join();
  fake().fail_calls("hipStreamSynchronize", 0, 0);
  EXPECT_TRUE(contains(status.message(), "hipStreamAddCallback")) << status.message();
  EXPECT_EQ(counter.releases, 1);
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
}

// The lost path on HIP. ROCm's hipStreamQuery answers only hipSuccess or
// hipErrorNotReady (docs/plugins/hip.md, "Faults, and the lost stream"), so
// ROCm never sends the plugin here; the fake stands in for a runtime that
// reports an error of the stream's own by an injected query failure. What
// this proves is the plugin's side: an answer other than those two, given
// to every query as a lost stream's error is, counts as lost (one such
// answer alone may pass, and is waited out), the owed release fires once
// instead of being waited for, synchronize fails naming the wait, and the
// stream's own callback, should it still run, fires nothing twice.
TEST_F(HipPluginTest, StreamQueryReportsAnError_OwedReleaseFiresOnce_SynchronizeFails) {
  ReleaseCounter counter;
  const PausedCopy copy = paused_copy(8, counter);
  ASSERT_NE(copy.pinned, nullptr);
  fake().fail_calls("hipStreamSynchronize", hipErrorUnknown, 1000);
  fake().fail_calls("hipStreamQuery", hipErrorIllegalAddress, 1000);
  const Status failed = plugin().synchronize(0);
  fake().fail_calls("hipStreamSynchronize", 0, 0);
  fake().fail_calls("hipStreamQuery", 0, 0);
  EXPECT_EQ(failed.code(), StatusCode::device_error);
  EXPECT_TRUE(contains(failed.message(), "hipStreamSynchronize")) << failed.message();
  EXPECT_EQ(counter.releases, 1);
  resume_and_check(copy, counter);
}

// ROCm 6.2-6.4 crash in hipStreamSynchronize once some 53 000 stream
// callbacks were queued since the stream's last completed synchronize
// (ROCm/legacy-rocm-build#4751), and the plugin queues one per until-released
// copy. It synchronizes on its own before it queues more than
// HipDevice::kCallbacksPerWait (4096); the fake, given that limit, records a
// violation at any synchronize or destroy that finds more. Without delay, so
// that twice the bound of copies runs quickly.
TEST_F(HipPluginTest, ManyUntilReleasedCopies_NoMoreThan4096CallbacksQueuedBetweenSynchronizes) {
  constexpr uint64_t kBound = 4096;
  constexpr uint64_t kCopies = 2 * kBound + 1;
  constexpr size_t kBytes = 64;
  fake().control<devalloc_fake_hip_set_delay_us_fn>("set_delay_us")(0);
  fake().control<devalloc_fake_hip_set_callback_chain_limit_fn>("set_callback_chain_limit")(
      kBound);
  Result<uint64_t> base = plugin().allocate(0, kBytes, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(kBytes);
  ASSERT_TRUE(pinned.ok());
  const auto expected = pattern(kBytes, 9);
  std::copy(expected.begin(), expected.end(), static_cast<uint8_t*>(*pinned));
  ReleaseCounter counter;
  for (uint64_t i = 0; i < kCopies; ++i) {
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(0, *base, *pinned, kBytes,
                                                   ReleaseCounter::on_release, &counter)
                    .ok())
        << "copy " << i;
  }
  // Two waits of the plugin's own (before copies 4097 and 8193), then this.
  EXPECT_EQ(fake().calls("hipStreamSynchronize"), 2u);
  ASSERT_TRUE(plugin().synchronize(0).ok());
  EXPECT_EQ(counter.releases, static_cast<int>(kCopies));
  EXPECT_EQ(fake().violations(), "");
  EXPECT_EQ(fake().read(*base, kBytes), expected);
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
  fake().reset();
}

// The wait the plugin makes before it queues more than 4096 callbacks
// fails (the stream idle: it ran everything): the copy is not queued, so
// its call fails naming that wait, not silently succeeds; its source is
// released once, before the call returns, and the bytes never land.
TEST_F(HipPluginTest, WaitBeforeCallback4097Fails_CopyFailsNamingTheWaitAndIsReleasedOnce) {
  constexpr uint64_t kBound = 4096;
  constexpr size_t kBytes = 64;
  fake().control<devalloc_fake_hip_set_delay_us_fn>("set_delay_us")(0);
  Result<uint64_t> base = plugin().allocate(0, 2 * kBytes, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(2 * kBytes);
  ASSERT_TRUE(pinned.ok());
  auto* source = static_cast<uint8_t*>(*pinned);
  const auto before = pattern(kBytes, 10);
  std::copy(before.begin(), before.end(), source);
  ReleaseCounter counter;
  for (uint64_t i = 0; i < kBound; ++i) {
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(0, *base, source, kBytes,
                                                   ReleaseCounter::on_release, &counter)
                    .ok())
        << "copy " << i;
  }
  const auto never = pattern(kBytes, 11);
  std::copy(never.begin(), never.end(), source + kBytes);
  ASSERT_TRUE(plugin().copy_to_device(0, *base + kBytes, source, kBytes).ok());
  fake().fail_next("hipStreamSynchronize", hipErrorUnknown);
  ReleaseCounter last;
  const Status status = plugin().copy_to_device_until_released(
      0, *base + kBytes, source + kBytes, kBytes, ReleaseCounter::on_release, &last);
  EXPECT_EQ(status.code(), StatusCode::device_error);
  EXPECT_TRUE(contains(status.message(), "hipStreamSynchronize")) << status.message();
  EXPECT_TRUE(contains(status.message(), "4096")) << status.message();
  EXPECT_EQ(last.releases, 1);
  ASSERT_TRUE(plugin().synchronize(0).ok());
  EXPECT_EQ(counter.releases, static_cast<int>(kBound));
  EXPECT_EQ(last.releases, 1);
  EXPECT_EQ(fake().read(*base + kBytes, kBytes), before) << "the refused copy landed";
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
}

// ROCm cuts its callback chain only at a hipStreamSynchronize during which
// nothing was queued on the stream (the fake models this). The wait the
// plugin makes before callback 4097 holds the submission lock, so no
// until-released copy can be queued meanwhile; a during-call copy from
// another thread must not be queued meanwhile either, or that wait cuts
// nothing, the plugin still counts the chain as cut, and with other threads
// keeping the stream busy the chain grows past ROCm's limit.
TEST_F(HipPluginTest, DuringCallCopyWhileTheBoundedWaitRuns_IsQueuedOnlyAfterIt) {
  constexpr uint64_t kBound = 4096;
  constexpr size_t kBytes = 64;
  fake().control<devalloc_fake_hip_set_delay_us_fn>("set_delay_us")(0);
  Result<uint64_t> base = plugin().allocate(0, 2 * kBytes, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(2 * kBytes);
  ASSERT_TRUE(pinned.ok());
  auto* source = static_cast<uint8_t*>(*pinned);
  const auto first = pattern(kBytes, 12);
  const auto second = pattern(kBytes, 13);
  std::copy(first.begin(), first.end(), source);
  std::copy(second.begin(), second.end(), source + kBytes);
  ReleaseCounter counter;
  fake().pause(true);
  for (uint64_t i = 0; i < kBound; ++i) {
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(0, *base, source, kBytes,
                                                   ReleaseCounter::on_release, &counter)
                    .ok())
        << "copy " << i;
  }
  const uint64_t queued = fake().calls("hipMemcpyHtoDAsync");
  // Copy 4097 waits for the paused stream first.
  std::thread bounded([&] {
    EXPECT_TRUE(plugin()
                    .copy_to_device_until_released(0, *base, source, kBytes,
                                                   ReleaseCounter::on_release, &counter)
                    .ok());
  });
  for (int i = 0; i < 5000 && fake().calls("hipStreamSynchronize") == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(fake().calls("hipStreamSynchronize"), 1u) << "the plugin did not wait before "
                                                        "callback 4097";
  // From pinned memory HIP queues the copy rather than running it at once.
  std::thread during([&] {
    EXPECT_TRUE(plugin().copy_to_device(0, *base + kBytes, source + kBytes, kBytes).ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(fake().calls("hipMemcpyHtoDAsync"), queued)
      << "a copy was queued while the plugin's own synchronize waited";
  fake().pause(false);
  bounded.join();
  during.join();
  ASSERT_TRUE(plugin().synchronize(0).ok());
  EXPECT_EQ(counter.releases, static_cast<int>(kBound + 1));
  EXPECT_EQ(fake().read(*base + kBytes, kBytes), second);
  EXPECT_EQ(fake().violations(), "");
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
  fake().reset();
}

TEST_F(HipPluginTest, FreeFails_AllocationStaysTrackedAndCanBeFreedAgain) {
  Result<uint64_t> base = plugin().allocate(0, kChunk, 0);
  ASSERT_TRUE(base.ok());
  fake().fail_next("hipFree", hipErrorUnknown);
  EXPECT_EQ(plugin().deallocate(0, *base).code(), StatusCode::device_error);
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
  EXPECT_EQ(fake().live_allocations(-1), 0u);
}

TEST_F(HipPluginTest, DestroyWithCopiesInFlight_WaitsAndReleasesEachOnce) {
  constexpr int kCopies = 8;
  Result<uint64_t> base = plugin().allocate(0, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(kCopies * kChunk);
  ASSERT_TRUE(pinned.ok());
  std::deque<ReleaseCounter> counters(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(
                        0, *base + i * kChunk, static_cast<uint8_t*>(*pinned) + i * kChunk,
                        kChunk, ReleaseCounter::on_release, &counters[i])
                    .ok());
  }
  destroy_plugin();
  for (int i = 0; i < kCopies; ++i) EXPECT_EQ(counters[i].releases, 1) << "copy " << i;
  EXPECT_EQ(fake().live_allocations(-1), 0u);
}

#if DEVALLOC_ABI_VERSION_MINOR >= 1
TEST_F(HipPluginTest, MemoryInfo_IsHipMemGetInfoOfTheDeviceAsked) {
  constexpr uint64_t kTotal = uint64_t{1} << 30, kBytes = uint64_t{1} << 20;
  const Result<uint64_t> address = plugin().allocate(1, kBytes, 0);
  ASSERT_TRUE(address.ok());
  const Result<std::optional<MemoryInfo>> on1 = plugin().memory_info(1);
  ASSERT_TRUE(on1.ok()) << on1.status().message();
  ASSERT_TRUE((*on1).has_value()) << "the HIP plugin offers get_memory_info";
  EXPECT_EQ((*on1)->total_bytes, kTotal);
  EXPECT_EQ((*on1)->free_bytes, kTotal - kBytes);
  const Result<std::optional<MemoryInfo>> on0 = plugin().memory_info(0);
  ASSERT_TRUE(on0.ok() && (*on0).has_value());
  EXPECT_EQ((*on0)->free_bytes, kTotal) << "device 0 reported device 1's memory";
  EXPECT_EQ(current_device(), 0);
  EXPECT_TRUE(plugin().deallocate(1, *address).ok());
}
#endif

}  // namespace
}  // namespace devalloc::hip_test
