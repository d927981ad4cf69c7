// The Level Zero plugin against the fake driver, through Debian's loader:
// what it reports about devices, how it completes "until released" copies
// (events, a completion thread, no host call needed), and how Level Zero
// failures reach the caller.
#include "level_zero_fixture.hpp"

#include <level_zero/ze_api.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <thread>

namespace devalloc::level_zero_test {
namespace {

constexpr uint32_t kDevice = 0;
constexpr size_t kChunk = 64 * 1024;
// ZeDevice::kEvents: the size of each device's event pool.
constexpr int kEventsPerDevice = 64;

using LevelZeroDevices = LevelZeroPluginTest;
using LevelZeroCopies = LevelZeroPluginTest;
using LevelZeroErrors = LevelZeroPluginTest;

TEST_F(LevelZeroDevices,
       TwoFakeDevices_PropertiesComeFromTheDriver_UuidPciAndOneApiType) {
  const auto& devices = plugin().devices();
  ASSERT_EQ(devices.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(devices[i].name, "Fake Level Zero Device " + std::to_string(i));
    EXPECT_EQ(devices[i].total_memory_bytes, uint64_t{1} << 30);
    EXPECT_EQ(devices[i].uuid_string(),
              "1e7e1020-de5a-4000-8000-0000000000" +
                  std::string(i == 0 ? "00" : "01"));
    EXPECT_EQ(devices[i].pci_bus_id, i == 0 ? "0000:3a:00.0" : "0000:3b:00.0");
    EXPECT_EQ(devices[i].dlpack_device_type, DEVALLOC_DLPACK_ONEAPI);
    EXPECT_EQ(devices[i].dlpack_device_id, static_cast<int32_t>(i));
  }
  EXPECT_TRUE(plugin().capabilities().host_staging);
  EXPECT_TRUE(plugin().capabilities().async_copy);
}

#if DEVALLOC_ABI_VERSION_MINOR >= 1
TEST_F(LevelZeroDevices, MemoryInfo_TotalFromTheDriver_FreeLessWhatThisInstanceHoldsThere) {
  constexpr uint64_t kTotal = uint64_t{1} << 30, kBytes = uint64_t{1} << 20;
  const Result<uint64_t> address = plugin().allocate(1, kBytes, 0);
  ASSERT_TRUE(address.ok());
  const Result<std::optional<MemoryInfo>> on1 = plugin().memory_info(1);
  ASSERT_TRUE(on1.ok()) << on1.status().message();
  ASSERT_TRUE((*on1).has_value()) << "the Level Zero plugin offers get_memory_info";
  EXPECT_EQ((*on1)->total_bytes, kTotal);
  EXPECT_EQ((*on1)->free_bytes, kTotal - kBytes);
  const Result<std::optional<MemoryInfo>> on0 = plugin().memory_info(0);
  ASSERT_TRUE(on0.ok() && (*on0).has_value());
  EXPECT_EQ((*on0)->free_bytes, kTotal) << "device 0 reported device 1's memory";
  EXPECT_TRUE(plugin().deallocate(1, *address).ok());
  const Result<std::optional<MemoryInfo>> freed = plugin().memory_info(1);
  ASSERT_TRUE(freed.ok() && (*freed).has_value());
  EXPECT_EQ((*freed)->free_bytes, kTotal);
}
#endif

TEST_F(LevelZeroCopies,
       UntilReleasedCopies_ReleasedAfterTheListRan_WithoutSynchronize) {
  constexpr int kCopies = 8;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok()) << base.status().message();
  std::vector<std::vector<uint8_t>> sources;
  ReleaseCounter counter;
  fake().pause(true);
  for (int i = 0; i < kCopies; ++i) {
    sources.push_back(pattern(kChunk, i));
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(
                        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
                        ReleaseCounter::on_release, &counter)
                    .ok());
  }
  EXPECT_EQ(counter.releases, 0) << "released before the command list ran";
  fake().pause(false);
  // No synchronize: the completion thread sees the events and releases.
  ASSERT_TRUE(wait_for_releases(counter, kCopies))
      << "only " << counter.releases << " of " << kCopies
      << " releases came without a synchronize";
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(fake().read(*base + i * kChunk, kChunk), sources[i]) << i;
  }
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, kCopies);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(LevelZeroCopies,
       ManyMoreCopiesThanEvents_EventsOfThePoolAreResetAndReused) {
  const int copies = 3 * kEventsPerDevice;
  Result<uint64_t> base = plugin().allocate(kDevice, copies * 256, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(copies * 256, 5);
  ReleaseCounter counter;
  for (int i = 0; i < copies; ++i) {
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(
                        kDevice, *base + i * 256, source.data() + i * 256, 256,
                        ReleaseCounter::on_release, &counter)
                    .ok());
  }
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, copies);
  EXPECT_EQ(fake().read(*base, source.size()), source);
  EXPECT_EQ(fake().calls("zeEventCreate"), 0u) << "events made per copy";
  EXPECT_EQ(fake().calls("zeEventPoolCreate"), 0u);
  // One reset per copy, and one for synchronize's barrier.
  EXPECT_EQ(fake().calls("zeEventHostReset"), static_cast<uint64_t>(copies + 1));
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(LevelZeroCopies,
       UntilReleasedSourceChangedBeforeRelease_FakeReportsTheChangedSource) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 1);
  ReleaseCounter counter;
  fake().pause(true);
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, source.data(),
                                                 kChunk,
                                                 ReleaseCounter::on_release,
                                                 &counter)
                  .ok());
  // The misuse: the caller touches src before its release.
  source[kChunk / 2] ^= 0xff;
  fake().pause(false);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, 1);
  const std::string violations = fake().violations();
  EXPECT_NE(violations.find("changed between the append"), std::string::npos)
      << violations;
  fake().reset();
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(LevelZeroCopies,
       DuringCallAndDeviceToHost_SourceReusedAtOnce_BytesRoundTrip) {
  Result<uint64_t> base = plugin().allocate(1, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 7);
  const std::vector<uint8_t> expected = source;
  ASSERT_TRUE(plugin().copy_to_device(1, *base, source.data(), kChunk).ok());
  std::fill(source.begin(), source.end(), uint8_t{0xee});
  std::vector<uint8_t> back(kChunk);
  ASSERT_TRUE(plugin().copy_to_host(1, back.data(), *base, kChunk).ok());
  EXPECT_EQ(back, expected);
  EXPECT_TRUE(plugin().deallocate(1, *base).ok());
}

// Commands of one immediate list may overlap unless a barrier orders them
// (the fake runs them in order, so only the barrier itself shows): a read
// back appends one before its copy, so that it reads after every earlier
// copy to the device (PLUGIN-16); a copy to the device needs none.
TEST_F(LevelZeroCopies, DeviceToHost_AppendsABarrierBeforeItsCopy) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> source = pattern(kChunk, 8);
  ReleaseCounter counter;
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, source.data(), kChunk,
                                                 ReleaseCounter::on_release, &counter)
                  .ok());
  EXPECT_EQ(fake().calls("zeCommandListAppendBarrier"), 0u);
  std::vector<uint8_t> back(kChunk);
  ASSERT_TRUE(plugin().copy_to_host(kDevice, back.data(), *base, kChunk).ok());
  EXPECT_EQ(fake().calls("zeCommandListAppendBarrier"), 1u);
  EXPECT_EQ(back, source);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, 1);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(LevelZeroCopies,
       CopiesFromFourThreadsOnOneDevice_TheCommandListIsNeverSharedAtOnce) {
  constexpr int kThreads = 4;
  constexpr int kCopies = 32;
  Result<uint64_t> base =
      plugin().allocate(kDevice, kThreads * kCopies * 1024, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kThreads * kCopies * 1024, 9);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCopies; ++i) {
        const size_t offset = (t * kCopies + i) * 1024;
        if (!plugin()
                 .copy_to_device(kDevice, *base + offset,
                                 source.data() + offset, 1024)
                 .ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(fake().read(*base, source.size()), source);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(LevelZeroErrors,
       AllocationRefusedByTheDriver_ErrorNamesTheCallAndTheResult) {
  fake().fail_next("zeMemAllocDevice", ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
  Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_FALSE(base.ok());
  EXPECT_EQ(base.status().code(), StatusCode::out_of_device_memory);
  EXPECT_NE(base.status().message().find("zeMemAllocDevice(size = 4096"),
            std::string::npos)
      << base.status().message();
  EXPECT_NE(
      base.status().message().find("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY"),
      std::string::npos)
      << base.status().message();
}

TEST_F(LevelZeroErrors, MoreThanTheDeviceHolds_OutOfDeviceMemory) {
  Result<uint64_t> all = plugin().allocate(kDevice, uint64_t{1} << 30, 0);
  ASSERT_TRUE(all.ok()) << all.status().message();
  Result<uint64_t> more = plugin().allocate(kDevice, 4096, 0);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::out_of_device_memory);
  EXPECT_TRUE(plugin().deallocate(kDevice, *all).ok());
}

// The fake's maxMemAllocSize is a quarter of its memory, as on many Intel
// GPUs (4 GiB of 16): a larger allocation needs relaxed limits chained to
// its descriptor, or the driver refuses it (ZE_RESULT_ERROR_UNSUPPORTED_SIZE).
TEST_F(LevelZeroErrors, AllocationAboveMaxMemAllocSize_SucceedsWithRelaxedLimits) {
  constexpr uint64_t kHalf = uint64_t{1} << 29;  // twice maxMemAllocSize
  Result<uint64_t> base = plugin().allocate(kDevice, kHalf, 0);
  ASSERT_TRUE(base.ok()) << base.status().message();
  const std::vector<uint8_t> tail = pattern(kChunk, 3);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base + kHalf - kChunk, tail.data(), kChunk).ok());
  EXPECT_EQ(fake().read(*base + kHalf - kChunk, kChunk), tail);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(LevelZeroErrors, AllocationTheDriverRefusesForItsSize_IsOutOfDeviceMemorySayingWhy) {
  fake().fail_next("zeMemAllocDevice", ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  Result<uint64_t> base = plugin().allocate(kDevice, uint64_t{1} << 29, 0);
  ASSERT_FALSE(base.ok());
  EXPECT_EQ(base.status().code(), StatusCode::out_of_device_memory);
  const std::string message = base.status().message();
  EXPECT_NE(message.find("with relaxed limits: maxMemAllocSize = 268435456) failed: "
                         "ZE_RESULT_ERROR_UNSUPPORTED_SIZE (the driver makes no single "
                         "allocation of this size)"),
            std::string::npos)
      << message;
}

TEST_F(LevelZeroErrors,
       DeviceLostDuringACopy_ReleasedAnyway_SynchronizeAndLaterCallsFail) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 2);
  ReleaseCounter counter;
  fake().lose_device_on_next_copy();
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, source.data(),
                                                 kChunk,
                                                 ReleaseCounter::on_release,
                                                 &counter)
                  .ok());
  Status sync = plugin().synchronize(kDevice);
  EXPECT_EQ(counter.releases, 1);
  ASSERT_FALSE(sync.ok());
  EXPECT_EQ(sync.code(), StatusCode::device_error);
  EXPECT_NE(sync.message().find("ZE_RESULT_ERROR_DEVICE_LOST"),
            std::string::npos)
      << sync.message();
  // A lost device keeps failing, also when asked for its free memory (a
  // host picking a device by it must not pick a lost one).
  EXPECT_FALSE(plugin().synchronize(kDevice).ok());
  EXPECT_FALSE(plugin().copy_to_device(kDevice, *base, source.data(), 64).ok());
  const Result<std::optional<MemoryInfo>> memory = plugin().memory_info(kDevice);
  ASSERT_FALSE(memory.ok()) << "a lost device reported its free memory";
  EXPECT_EQ(memory.status().code(), StatusCode::device_error);
  EXPECT_NE(memory.status().message().find("lost"), std::string::npos)
      << memory.status().message();
  // The other device is unaffected.
  EXPECT_TRUE(plugin().synchronize(1).ok());
  EXPECT_TRUE(plugin().memory_info(1).ok());
  fake().reset();
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// A device can be found lost by any call, not only by a copy's event: here
// by the barrier that synchronize appends. The error names that call
// (PLUGIN-6), and so does every later failure of the lost device.
TEST_F(LevelZeroErrors, BarrierOfSynchronizeFindsTheDeviceLost_ErrorsNameTheBarrier) {
  fake().fail_next("zeCommandListAppendBarrier", ZE_RESULT_ERROR_DEVICE_LOST);
  const Status sync = plugin().synchronize(kDevice);
  ASSERT_FALSE(sync.ok());
  EXPECT_EQ(sync.code(), StatusCode::device_error);
  EXPECT_NE(sync.message().find("zeCommandListAppendBarrier"), std::string::npos)
      << sync.message();
  EXPECT_NE(sync.message().find("ZE_RESULT_ERROR_DEVICE_LOST"), std::string::npos)
      << sync.message();
  const Result<uint64_t> later = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_FALSE(later.ok());
  EXPECT_NE(later.status().message().find(
                "device 0 is lost (zeCommandListAppendBarrier answered "
                "ZE_RESULT_ERROR_DEVICE_LOST)"),
            std::string::npos)
      << later.status().message();
  fake().reset();
}

// A wait for a copy's event that fails (not with a lost device) says
// nothing of the copy: it may still read its source or write its
// destination. The plugin waits on (polls the event) until the copy is
// over; only then does it release the source or let the call return.
// The command list is paused meanwhile, so the copy cannot have run.
TEST_F(LevelZeroErrors, UntilReleasedCopyWhoseWaitsFail_ReleasedOnlyOnceTheCopyRan) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 6);
  const std::vector<uint8_t> expected = source;
  ReleaseCounter counter;
  fake().pause(true);
  fake().fail_calls("zeEventHostSynchronize", ZE_RESULT_ERROR_UNKNOWN, 5);
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, source.data(), kChunk,
                                                 ReleaseCounter::on_release, &counter)
                  .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(counter.releases, 0) << "released while the copy had not run";
  fake().pause(false);
  ASSERT_TRUE(wait_for_releases(counter, 1));
  // The source is the caller's again: the fake records a copy reading it.
  std::fill(source.begin(), source.end(), uint8_t{0xbb});
  EXPECT_TRUE(plugin().synchronize(kDevice).ok()) << "the copy landed";
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_EQ(counter.releases, 1);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// Runs call() on a thread of its own; tells whether it returned within
// `patience` and, once it has, what it returned.
class CallOnItsOwnThread {
 public:
  explicit CallOnItsOwnThread(std::function<Status()> call)
      : thread_([this, call = std::move(call)] {
          status_ = call();
          returned_ = true;
        }) {}
  ~CallOnItsOwnThread() {
    if (thread_.joinable()) thread_.join();
  }
  bool returned_within(std::chrono::milliseconds patience) const {
    std::this_thread::sleep_for(patience);
    return returned_;
  }
  Status result() {
    thread_.join();
    return status_;
  }

 private:
  std::atomic<bool> returned_{false};
  Status status_;
  std::thread thread_;
};

TEST_F(LevelZeroErrors, DuringCallCopyWhoseWaitsFail_ReturnsOnlyOnceTheCopyRan) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 4);
  const std::vector<uint8_t> expected = source;
  fake().pause(true);
  fake().fail_calls("zeEventHostSynchronize", ZE_RESULT_ERROR_UNKNOWN, 5);
  CallOnItsOwnThread copy(
      [&] { return plugin().copy_to_device(kDevice, *base, source.data(), kChunk); });
  EXPECT_FALSE(copy.returned_within(std::chrono::milliseconds(100)))
      << "returned while the copy had not read its source";
  fake().pause(false);
  const Status copied = copy.result();
  EXPECT_TRUE(copied.ok()) << copied.message();
  std::fill(source.begin(), source.end(), uint8_t{0xee});
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(LevelZeroErrors, DeviceToHostCopyWhoseWaitsFail_ReturnsOnlyOnceTheBufferIsWritten) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> expected = pattern(kChunk, 5);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base, expected.data(), kChunk).ok());
  std::vector<uint8_t> back(kChunk);
  fake().pause(true);
  fake().fail_calls("zeEventHostSynchronize", ZE_RESULT_ERROR_UNKNOWN, 5);
  CallOnItsOwnThread copy(
      [&] { return plugin().copy_to_host(kDevice, back.data(), *base, kChunk); });
  EXPECT_FALSE(copy.returned_within(std::chrono::milliseconds(100)))
      << "returned while the copy had not written the buffer";
  fake().pause(false);
  const Status copied = copy.result();
  EXPECT_TRUE(copied.ok()) << copied.message();
  EXPECT_EQ(back, expected);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// The waits fail, and then the device is lost running the copy: the wait
// ends there, the source is released, and synchronize names the loss.
// With the event queries failing too, the device's own status tells.
TEST_F(LevelZeroErrors, CopyWhoseWaitsAndQueriesFail_EndsWhenTheDeviceReportsItselfLost) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> source = pattern(kChunk, 3);
  ReleaseCounter counter;
  fake().pause(true);
  fake().fail_calls("zeEventHostSynchronize", ZE_RESULT_ERROR_UNKNOWN, 1);
  fake().fail_calls("zeEventQueryStatus", ZE_RESULT_ERROR_UNKNOWN, 1000000);
  fake().lose_device_on_next_copy();
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, source.data(), kChunk,
                                                 ReleaseCounter::on_release, &counter)
                  .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(counter.releases, 0) << "released while the copy had not run";
  fake().pause(false);
  ASSERT_TRUE(wait_for_releases(counter, 1));
  EXPECT_GT(fake().calls("zeDeviceGetStatus"), 0u);
  const Status sync = plugin().synchronize(kDevice);
  EXPECT_EQ(sync.code(), StatusCode::device_error);
  EXPECT_NE(sync.message().find("lost"), std::string::npos) << sync.message();
  fake().reset();
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// Events whose reset fails are retired. With all 64 retired there is no
// event left for synchronize's barrier: it fails, but only after every
// release owed has come (PLUGIN-17), also one that takes its time.
TEST_F(LevelZeroErrors, EveryEventRetired_SynchronizeFailsOnlyAfterTheReleasesOwed) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> source = pattern(kChunk, 9);
  // Every reset is tried three times (give_back) before the event goes.
  fake().fail_calls("zeEventHostReset", ZE_RESULT_ERROR_UNKNOWN, 3 * kEventsPerDevice);
  for (int i = 0; i + 1 < kEventsPerDevice; ++i) {
    ASSERT_TRUE(plugin().copy_to_device(kDevice, *base, source.data(), 256).ok()) << i;
  }
  struct SlowRelease {
    std::atomic<bool> done{false};
    static void on_release(void* self) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      static_cast<SlowRelease*>(self)->done = true;
    }
  } release;
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, source.data(), kChunk,
                                                 SlowRelease::on_release, &release)
                  .ok());
  const Status sync = plugin().synchronize(kDevice);
  EXPECT_TRUE(release.done) << "synchronize returned with a release still owed";
  EXPECT_EQ(sync.code(), StatusCode::device_error);
  EXPECT_NE(sync.message().find("all 64 events"), std::string::npos) << sync.message();
  EXPECT_EQ(fake().read(*base, kChunk), source);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// A device-to-host copy whose barrier was appended but whose copy was not
// leaves the barrier on the list with no event tracking it. Destroy waits
// for it (a barrier with an event behind it) before it destroys the list:
// the fake records a list destroyed with unfinished commands.
TEST_F(LevelZeroErrors, BarrierLeftWithoutItsCopy_DestroyWaitsForItBeforeTheListGoes) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  fake().pause(true);
  fake().fail_next("zeCommandListAppendMemoryCopy", ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
  std::vector<uint8_t> back(kChunk);
  const Status copied = plugin().copy_to_host(kDevice, back.data(), *base, kChunk);
  ASSERT_FALSE(copied.ok());
  EXPECT_NE(copied.message().find("zeCommandListAppendMemoryCopy"), std::string::npos)
      << copied.message();
  ASSERT_EQ(fake().calls("zeCommandListAppendBarrier"), 1u);
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    destroy_plugin();
    destroyed = true;
  });
  // The paused list holds the barrier: destroy appends its own and waits.
  while (fake().calls("zeCommandListAppendBarrier") < 2 && !destroyed) {
    std::this_thread::yield();
  }
  EXPECT_FALSE(destroyed) << "destroy did not wait for the barrier left on the paused list";
  fake().pause(false);
  destroyer.join();
  // TearDown expects no violation.
}

// A driver that answers ZE_RESULT_SUCCESS without memory (a NULL pointer):
// the plugin hands out no address 0 and no NULL staging buffer, but fails
// naming the call, counts nothing as used, and frees nothing at destroy.
TEST_F(LevelZeroErrors, AllocationAnsweredSuccessWithoutMemory_IsADeviceErrorNamingTheCall) {
  fake().null_result_next("zeMemAllocDevice");
  const Result<uint64_t> address = plugin().allocate(1, 4096, 0);
  ASSERT_FALSE(address.ok()) << "handed out address 0x" << std::hex << *address;
  EXPECT_EQ(address.status().code(), StatusCode::device_error);
  EXPECT_NE(address.status().message().find(
                "zeMemAllocDevice(size = 4096, alignment = 256, device 1) returned "
                "ZE_RESULT_SUCCESS without memory (a null pointer)"),
            std::string::npos)
      << address.status().message();
#if DEVALLOC_ABI_VERSION_MINOR >= 1
  const Result<std::optional<MemoryInfo>> memory = plugin().memory_info(1);
  ASSERT_TRUE(memory.ok() && (*memory).has_value());
  EXPECT_EQ((*memory)->free_bytes, (*memory)->total_bytes);
#endif

  fake().null_result_next("zeMemAllocHost");
  const Result<void*> host = plugin().allocate_host(kChunk);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), StatusCode::device_error);
  EXPECT_NE(host.status().message().find(
                "zeMemAllocHost(size = 65536) returned ZE_RESULT_SUCCESS without memory (a "
                "null pointer)"),
            std::string::npos)
      << host.status().message();

  destroy_plugin();
  EXPECT_EQ(fake().calls("zeMemFree"), 0u);
}

// zeMemAllocDevice is asked for the alignment itself and for no more bytes
// than the buffer needs. A driver that answers with memory not aligned as
// asked must not have the plugin hand out the next aligned address inside
// it: fewer than nbytes lie behind that one, and copies to the buffer's end
// would write past the driver's allocation. The allocation fails naming
// the call, and the memory is given back.
TEST_F(LevelZeroErrors, DriverIgnoresTheAlignment_AllocationFailsAndTheMemoryIsFreed) {
  fake().ignore_alignment_next("zeMemAllocDevice");
  const Result<uint64_t> address = plugin().allocate(kDevice, kChunk, 4096);
  ASSERT_FALSE(address.ok()) << "handed out 0x" << std::hex << *address
                             << ", past the start of memory not aligned to 4096";
  EXPECT_EQ(address.status().code(), StatusCode::device_error);
  EXPECT_NE(address.status().message().find(
                "zeMemAllocDevice(size = 65536, alignment = 4096, device 0) returned 0x"),
            std::string::npos)
      << address.status().message();
  EXPECT_NE(address.status().message().find(", not aligned to 4096"), std::string::npos)
      << address.status().message();
  EXPECT_EQ(fake().calls("zeMemFree"), 1u);
  EXPECT_EQ(fake().live_allocations(kDevice), 0u);
}

TEST_F(LevelZeroErrors, StagingMemoryBeyondTheHost_IsOutOfHostMemoryNamingZeMemAllocHost) {
  fake().fail_next("zeMemAllocHost", ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
  const Result<void*> host = plugin().allocate_host(kChunk);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), StatusCode::out_of_host_memory);
  EXPECT_NE(host.status().message().find("zeMemAllocHost"), std::string::npos)
      << host.status().message();
}

}  // namespace
}  // namespace devalloc::level_zero_test
