// Several threads copying to one PoCL device at once, each synchronizing
// while the others still copy (PLUGIN-17, PLUGIN-19): every byte lands,
// every release comes exactly once, and a synchronize returns only after
// the releases of the copies its thread issued before it. Run under TSan
// (label "concurrent"), with PoCL's own threads firing the releases.
#include <atomic>
#include <cstring>
#include <thread>

#include "opencl_fixture.hpp"

namespace devalloc::opencl_test {
namespace {

constexpr uint32_t kDevice = 0;

using OpenClConcurrency = OpenClPluginTest;

// Counts the releases of one thread's copies.
struct ThreadReleases {
  std::atomic<int> count{0};
  static void on_release(void* self) { static_cast<ThreadReleases*>(self)->count.fetch_add(1); }
};

TEST_F(OpenClConcurrency, ThreadsCopyingToOneDevice_AllBytesLandAndEachSyncCoversItsCopies) {
  constexpr int kThreads = 4, kRounds = 24;
  constexpr uint64_t kChunk = 16 * 1024 + 3;
  constexpr uint64_t kPerThread = kRounds * kChunk;
  const Result<uint64_t> base = plugin().allocate(kDevice, kThreads * kPerThread, 0);
  ASSERT_TRUE(base.ok()) << base.status().message();

  std::vector<std::vector<uint8_t>> sources;
  for (int t = 0; t < kThreads; ++t) sources.push_back(pattern(kPerThread, 100 + t));
  std::vector<ThreadReleases> releases(kThreads);
  std::atomic<int> failures{0};
  std::atomic<int> early_syncs{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t region = *base + t * kPerThread;
      int issued = 0;
      for (int r = 0; r < kRounds; ++r) {
        const uint8_t* src = sources[t].data() + r * kChunk;
        Status s;
        if (r % 3 == 2) {
          // During call, from a copy this thread overwrites at once.
          std::vector<uint8_t> scratch(src, src + kChunk);
          s = plugin().copy_to_device(kDevice, region + r * kChunk, scratch.data(), kChunk);
          std::memset(scratch.data(), 0, kChunk);
        } else {
          s = plugin().copy_to_device_until_released(kDevice, region + r * kChunk, src, kChunk,
                                                     ThreadReleases::on_release, &releases[t]);
          ++issued;
        }
        if (!s.ok()) ++failures;
        if (r % 8 == 7) {
          if (!plugin().synchronize(kDevice).ok()) ++failures;
          // Every release of this thread's earlier copies has come.
          if (releases[t].count.load() < issued) ++early_syncs;
        }
      }
      if (!plugin().synchronize(kDevice).ok()) ++failures;
      if (releases[t].count.load() != issued) ++early_syncs;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(early_syncs, 0) << "a synchronize returned before the releases of earlier copies";
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(read(*base + t * kPerThread, kPerThread), sources[t]) << "thread " << t;
  }
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(OpenClConcurrency, ThreadsMappingAndAllocating_EachMappingRoundTrips) {
  constexpr int kThreads = 4, kRounds = 16;
  constexpr uint64_t kSize = 8192;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const Result<uint64_t> a = plugin().allocate(kDevice, kSize, 0);
        if (!a.ok()) {
          ++failures;
          continue;
        }
        const std::vector<uint8_t> bytes = pattern(kSize, t * 1000 + r);
        const Result<void*> host = plugin().map_to_host(kDevice, *a, kSize);
        if (host.ok()) {
          std::memcpy(*host, bytes.data(), kSize);
          if (!plugin().unmap_from_host(kDevice, *host).ok()) ++failures;
          std::vector<uint8_t> back(kSize);
          if (!plugin().copy_to_host(kDevice, back.data(), *a, kSize).ok() || back != bytes) {
            ++failures;
          }
        } else {
          ++failures;
        }
        if (!plugin().deallocate(kDevice, *a).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
}

TEST_F(OpenClConcurrency, DestroyWithCopiesInFlight_FiresEveryReleaseOnce) {
  constexpr int kCopies = 64;
  constexpr uint64_t kChunk = 32 * 1024;
  const Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> source = pattern(kCopies * kChunk, 9);
  ReleaseCounter counter;
  ASSERT_TRUE(copy_chunks_until_released(*base, source, kCopies, kChunk, counter));
  // No synchronize, no deallocate: destroy waits, releases and frees
  // (PLUGIN-9).
  destroy_plugin();
  EXPECT_EQ(counter.releases, kCopies);
}

}  // namespace
}  // namespace devalloc::opencl_test
