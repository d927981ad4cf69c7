// When may the caller reuse the source of a copy? The fake driver hashes
// each asynchronous copy's source when the copy is issued and again when its
// stream reads it; these tests show that the plugin gives it nothing to
// report when used correctly, and that misuse is caught.
#include "cuda_fixture.hpp"

#include <algorithm>
#include <deque>

namespace devalloc::cuda_test {
namespace {

constexpr uint32_t kDevice = 0;
constexpr size_t kChunk = 64 * 1024;

using CudaLifetime = CudaPluginTest;

TEST_F(
    CudaLifetime,
    DuringCallCopiesFromPageableMemory_SourceOverwrittenAtOnce_DeviceHoldsTheOriginalBytes) {
  constexpr int kCopies = 8;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok()) << base.status().message();
  std::vector<uint8_t> source(kChunk);
  for (int i = 0; i < kCopies; ++i) {
    source = pattern(kChunk, i);
    ASSERT_TRUE(
        plugin()
            .copy_to_device(kDevice, *base + i * kChunk, source.data(), kChunk)
            .ok());
    std::fill(source.begin(), source.end(), uint8_t{0xee});
  }
  // Read straight from the fake, so that no plugin call can wait for late
  // copies first.
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(fake().read(*base + i * kChunk, kChunk), pattern(kChunk, i))
        << "copy " << i;
  }
  EXPECT_EQ(fake().violations(), "");
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(
    CudaLifetime,
    DuringCallCopyFromPinnedMemory_SourceOverwrittenAtOnce_DeviceHoldsTheOriginalBytes) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  Result<void*> pinned = plugin().allocate_host(kChunk);
  ASSERT_TRUE(pinned.ok()) << pinned.status().message();
  auto* source = static_cast<uint8_t*>(*pinned);
  const std::vector<uint8_t> expected = pattern(kChunk, 3);
  std::copy(expected.begin(), expected.end(), source);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base, source, kChunk).ok());
  std::fill(source, source + kChunk, uint8_t{0xee});
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_EQ(fake().violations(), "");
  EXPECT_TRUE(plugin().free_host(*pinned).ok());
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(CudaLifetime,
       UntilReleasedCopies_ReleasedOnlyAfterTheStreamRan_ExactlyOnceEach) {
  constexpr int kCopies = 8;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<std::vector<uint8_t>> sources;
  std::deque<ReleaseCounter> counters(kCopies);
  fake().pause(true);
  for (int i = 0; i < kCopies; ++i) {
    sources.push_back(pattern(kChunk, i));
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(
                        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
                        ReleaseCounter::on_release, &counters[i])
                    .ok());
  }
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(counters[i].releases, 0)
        << "copy " << i << " was released before its stream ran";
  }
  fake().pause(false);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(counters[i].releases, 1) << "copy " << i;
    EXPECT_EQ(fake().read(*base + i * kChunk, kChunk), sources[i]);
  }
  EXPECT_EQ(fake().violations(), "");
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(
    CudaLifetime,
    UntilReleasedSourceOverwrittenBeforeRelease_FakeReportsTheChangedSource) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 1);
  ReleaseCounter counter;
  fake().pause(true);
  ASSERT_TRUE(
      plugin()
          .copy_to_device_until_released(kDevice, *base, source.data(), kChunk,
                                         ReleaseCounter::on_release, &counter)
          .ok());
  ASSERT_EQ(counter.releases, 0);
  // The misuse: the caller touches src before its release.
  source[kChunk / 2] ^= 0xff;
  fake().pause(false);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, 1);
  const std::string violations = fake().violations();
  EXPECT_NE(violations.find("source of async copy changed before the copy "
                            "read it"),
            std::string::npos)
      << violations;
  EXPECT_NE(violations.find(std::to_string(kChunk) + " bytes"),
            std::string::npos)
      << violations;
  fake().reset();
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(CudaLifetime,
       CopyCannotBeQueued_ReleasedOnceBeforeTheCallReturns_ErrorNamesTheCall) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 2);
  ReleaseCounter counter;
  fake().fail_next("cuMemcpyHtoDAsync_v2", CUDA_ERROR_INVALID_VALUE);
  const Status status = plugin().copy_to_device_until_released(
      kDevice, *base, source.data(), kChunk, ReleaseCounter::on_release,
      &counter);
  EXPECT_EQ(status.code(), StatusCode::device_error);
  EXPECT_NE(status.message().find("cuMemcpyHtoDAsync_v2(dstDevice = 0x"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find(
                "failed: CUDA_ERROR_INVALID_VALUE (invalid argument)"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(counter.releases, 1);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, 1);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(CudaLifetime,
       HostFunctionCannotBeQueued_ReleasedOnceAfterTheCopyReadTheSource) {
  Result<uint64_t> base = plugin().allocate(kDevice, kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(kChunk, 4);
  const std::vector<uint8_t> expected = source;
  ReleaseCounter counter;
  fake().fail_next("cuLaunchHostFunc", CUDA_ERROR_OUT_OF_MEMORY);
  const Status status = plugin().copy_to_device_until_released(
      kDevice, *base, source.data(), kChunk, ReleaseCounter::on_release,
      &counter);
  EXPECT_EQ(status.code(), StatusCode::device_error);
  EXPECT_NE(status.message().find("cuLaunchHostFunc"), std::string::npos)
      << status.message();
  ASSERT_EQ(counter.releases, 1);
  // Released means read: reusing the source now must not show.
  std::fill(source.begin(), source.end(), uint8_t{0});
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, 1);
  EXPECT_EQ(fake().read(*base, kChunk), expected);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

// The lost path as the CUDA driver takes it: a device fault leaves the
// context a sticky error, cuStreamQuery reports it, host functions never run
// again; the kit fires the owed releases instead (the fake models the
// sticky error, see tests/fakes/cuda/README.md).
TEST_F(
    CudaLifetime,
    DeviceFaultDuringAsyncCopies_SynchronizeIsADeviceError_EveryReleaseFiresOnce) {
  constexpr int kCopies = 4;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<std::vector<uint8_t>> sources;
  std::deque<ReleaseCounter> counters(kCopies);
  fake().fault_next_copy(CUDA_ERROR_ILLEGAL_ADDRESS);
  fake().pause(true);
  for (int i = 0; i < kCopies; ++i) {
    sources.push_back(pattern(kChunk, i));
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(
                        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
                        ReleaseCounter::on_release, &counters[i])
                    .ok());
  }
  fake().pause(false);
  const Status status = plugin().synchronize(kDevice);
  EXPECT_EQ(status.code(), StatusCode::device_error);
  EXPECT_NE(status.message().find("cuStreamSynchronize"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("CUDA_ERROR_ILLEGAL_ADDRESS (an illegal "
                                  "memory access was encountered)"),
            std::string::npos)
      << status.message();
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(counters[i].releases, 1) << "copy " << i;
  }
  destroy_plugin();
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(counters[i].releases, 1) << "copy " << i << " after destroy";
  }
}

TEST_F(CudaLifetime,
       DestroyWithCopiesInFlight_WaitsForThemAndReleasesEachOnce) {
  constexpr int kCopies = 16;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<std::vector<uint8_t>> sources;
  std::deque<ReleaseCounter> counters(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources.push_back(pattern(kChunk, i));
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(
                        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
                        ReleaseCounter::on_release, &counters[i])
                    .ok());
  }
  destroy_plugin();
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(counters[i].releases, 1) << "copy " << i;
  }
  EXPECT_EQ(fake().live_allocations(-1), 0u);
}

}  // namespace
}  // namespace devalloc::cuda_test
