// PLUGIN-17: when synchronize(device) returns, every copy to that device
// issued before it, from any thread, has landed and has been released.
#include "suite.hpp"

#include <atomic>
#include <thread>
#include <vector>

namespace devalloc::conformance {
namespace {

using Synchronize = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(Synchronize, "PLUGIN-17");

TEST_F(Synchronize, AfterCopiesFromSeveralThreads_EveryCopyHasLandedAndBeenReleased) {
  constexpr int kThreads = 4;
  constexpr int kCopiesPerThread = 16;
  constexpr int kCopies = kThreads * kCopiesPerThread;
  constexpr uint64_t kChunk = kMiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources[i] = pattern(kChunk, i);
    probes[i].arm(sources[i]);
  }
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kCopiesPerThread; ++k) {
          const int i = t * kCopiesPerThread + k;
          // Until released only: a plugin may make a during-call copy wait
          // for every earlier one, which would synchronize for this test.
          EXPECT_OK(plugin().copy_to_device_until_released(
              kDevice, *base + i * kChunk, sources[i].data(), kChunk,
              ReleaseProbe::on_release, &probes[i]))
              << "copy " << i;
        }
      });
    }
  }
  ASSERT_OK(plugin().synchronize(kDevice));
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], kBySynchronize)) << "copy " << i;
  }
  Result<std::vector<uint8_t>> read =
      read_device(kDevice, *base, kCopies * kChunk);
  ASSERT_OK(read);
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(BytesEqual(sources[i], std::span<const uint8_t>(*read).subspan(
                                           i * kChunk, kChunk)))
        << "copy " << i;
  }
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

TEST_F(Synchronize, WhileAnotherThreadKeepsCopying_CoversEveryCopyIssuedBeforeIt) {
  constexpr int kCopies = 256;
  constexpr uint64_t kChunk = 64 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources[i] = pattern(kChunk, i);
    probes[i].arm(sources[i]);
  }
  std::atomic<int> issued{0};
  std::jthread producer([&] {
    for (int i = 0; i < kCopies; ++i) {
      EXPECT_OK(plugin().copy_to_device_until_released(
          kDevice, *base + i * kChunk, sources[i].data(), kChunk,
          ReleaseProbe::on_release, &probes[i]));
      issued.store(i + 1);
    }
  });
  int checked = 0;
  while (checked < kCopies) {
    const int before = issued.load();
    ASSERT_OK(plugin().synchronize(kDevice));
    for (; checked < before; ++checked) {
      ASSERT_TRUE(ReleasedExactlyOnce(probes[checked], kBySynchronize))
          << "copy " << checked << " was issued before synchronize began";
    }
  }
  producer.join();
  Result<std::vector<uint8_t>> read =
      read_device(kDevice, *base, kCopies * kChunk);
  ASSERT_OK(read);
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(BytesEqual(sources[i], std::span<const uint8_t>(*read).subspan(
                                           i * kChunk, kChunk)))
        << "copy " << i;
  }
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

TEST_F(Synchronize, EveryDeviceWithNothingInFlight_ReturnsOk) {
  for (uint32_t device = 0; device < device_count(); ++device) {
    EXPECT_OK(plugin().synchronize(device)) << "device " << device;
  }
}

TEST_F(Synchronize, DeviceIndexAtTheCount_IsNoSuchDevice) {
  EXPECT_STATUS(plugin().synchronize(device_count()), StatusCode::no_such_device);
}

}  // namespace
}  // namespace devalloc::conformance
