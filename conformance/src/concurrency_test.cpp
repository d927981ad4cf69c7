// PLUGIN-19: every function but destroy is safe to call from several threads
// at once, also on one device.
#include "suite.hpp"

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace devalloc::conformance {
namespace {

using Concurrency = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(Concurrency, "PLUGIN-19");

constexpr int kThreads = 8;

TEST_F(Concurrency, ThreadsAllocatingCopyingAndFreeingAtOnce_AllSucceedWithTheirOwnBytes) {
  constexpr int kIterations = 24;
  const uint64_t max_alignment =
      std::min<uint64_t>(plugin().capabilities().max_alignment, 4096);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(
      kThreads * kIterations);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(
      kThreads * kIterations);
  std::vector<std::jthread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kIterations; ++k) {
        const int i = t * kIterations + k;
        // Sizes and alignments vary so that threads contend on different
        // sizes in the plugin's allocator.
        const uint64_t nbytes = 1 + (static_cast<uint64_t>(i) * 7919) % (256 * kKiB);
        const uint64_t alignment = std::max<uint64_t>(1, max_alignment >> (i % 6));
        Result<uint64_t> base = plugin().allocate(kDevice, nbytes, alignment);
        if (!base.ok()) {
          ADD_FAILURE() << "thread " << t << ": " << base.status().message();
          return;
        }
        sources[i] = pattern(nbytes, i);
        probes[i].arm(sources[i]);
        const Status copied =
            k % 2 == 0
                ? plugin().copy_to_device(kDevice, *base, sources[i].data(),
                                          nbytes)
                : plugin().copy_to_device_until_released(
                      kDevice, *base, sources[i].data(), nbytes,
                      ReleaseProbe::on_release, &probes[i]);
        Result<std::vector<uint8_t>> read = read_device(kDevice, *base, nbytes);
        const Status synchronized = plugin().synchronize(kDevice);
        const Status freed = plugin().deallocate(kDevice, *base);
        EXPECT_OK(copied) << "thread " << t;
        EXPECT_OK(read) << "thread " << t;
        EXPECT_OK(synchronized) << "thread " << t;
        EXPECT_OK(freed) << "thread " << t;
        const ::testing::AssertionResult landed =
            read.ok() ? BytesEqual(sources[i], *read)
                      : ::testing::AssertionFailure() << "nothing read back";
        EXPECT_TRUE(landed) << "thread " << t << ", iteration " << k;
        const ::testing::AssertionResult released =
            k % 2 == 0 ? ::testing::AssertionSuccess()
                       : ReleasedExactlyOnce(probes[i], "when its own synchronize returned "
                                                        "(PLUGIN-17, PLUGIN-20)");
        EXPECT_TRUE(released) << "thread " << t << ", iteration " << k;
        // One report per thread is enough to see what went wrong.
        if (!copied.ok() || !synchronized.ok() || !freed.ok() || !landed ||
            !released) {
          return;
        }
      }
    });
  }
}

TEST_F(Concurrency, ThreadsAllocatingAtOnce_NeverGetOverlappingRanges) {
  constexpr int kPerThread = 64;
  std::mutex mutex;
  std::vector<std::pair<uint64_t, uint64_t>> live;
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const uint64_t nbytes = 1 + static_cast<uint64_t>(t * kPerThread + k) % 3000;
          Result<uint64_t> base = plugin().allocate(kDevice, nbytes, 0);
          if (!base.ok()) {
            ADD_FAILURE() << "thread " << t << ": " << base.status().message();
            return;
          }
          std::lock_guard lock(mutex);
          live.emplace_back(*base, nbytes);
        }
      });
    }
  }
  std::sort(live.begin(), live.end());
  for (size_t i = 1; i < live.size(); ++i) {
    EXPECT_LE(live[i - 1].first + live[i - 1].second, live[i].first)
        << "allocations at 0x" << std::hex << live[i - 1].first << " and 0x"
        << live[i].first << " overlap";
  }
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = t; i < live.size(); i += kThreads) {
          EXPECT_OK(plugin().deallocate(kDevice, live[i].first));
        }
      });
    }
  }
}

}  // namespace
}  // namespace devalloc::conformance
