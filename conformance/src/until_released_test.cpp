// PLUGIN-9, PLUGIN-14: with DEVALLOC_SRC_UNTIL_RELEASED the caller keeps src
// unchanged until on_release, which comes exactly once per copy: after the
// copy read src, after a failure, or at destroy.
#include "suite.hpp"

#include <vector>

namespace devalloc::conformance {
namespace {

using UntilReleased = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(UntilReleased, "PLUGIN-9, PLUGIN-14");

TEST_F(UntilReleased, EveryCopy_IsReleasedExactlyOnceWithItsSourceUnchanged) {
  constexpr int kCopies = 32;
  constexpr uint64_t kChunk = 128 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    // Sizes vary so that copies finish out of order in a plugin that can.
    const uint64_t nbytes = kChunk - (i % 4) * 1000;
    sources[i] = pattern(nbytes, i);
    probes[i].arm(sources[i]);
    ASSERT_OK(plugin().copy_to_device_until_released(
        kDevice, *base + i * kChunk, sources[i].data(), nbytes,
        ReleaseProbe::on_release, &probes[i]));
  }
  ASSERT_OK(plugin().synchronize(kDevice));
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], kBySynchronize)) << "copy " << i;
    EXPECT_TRUE(probes[i].source_intact)
        << "copy " << i << ": the plugin wrote to src";
  }
  EXPECT_OK(plugin().deallocate(kDevice, *base));
  destroy_plugin();
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], kByDestroy)) << "copy " << i;
  }
}

TEST_F(UntilReleased, SourceOverwrittenAsSoonAsReleased_DeviceHoldsTheBytesFromBeforeRelease) {
  constexpr int kCopies = 16;
  constexpr uint64_t kChunk = 512 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources[i] = pattern(kChunk, i);
    probes[i].arm(sources[i], /*reuse_after_release=*/true);
    ASSERT_OK(plugin().copy_to_device_until_released(
        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
        ReleaseProbe::on_release, &probes[i]));
  }
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<std::vector<uint8_t>> read =
      read_device(kDevice, *base, kCopies * kChunk);
  ASSERT_OK(read);
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], kBySynchronize)) << "copy " << i;
    EXPECT_TRUE(BytesEqual(pattern(kChunk, i),
                           std::span<const uint8_t>(*read).subspan(
                               i * kChunk, kChunk)))
        << "copy " << i << " was released before it had read src: the device holds bytes "
        << "the caller wrote into src after the release (0xa5), which breaks PLUGIN-14 "
        << "(release only once the copy has read src)";
  }
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

TEST_F(UntilReleased, FailedCopy_IsStillReleasedExactlyOnce) {
  Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(base);
  auto& source = keep_past_destroy<std::vector<uint8_t>>(pattern(64, 1));
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(3);
  for (ReleaseProbe& probe : probes) probe.arm(source);
  EXPECT_STATUS(plugin().copy_to_device_until_released(
                    kDevice, *base + 4096 - 32, source.data(), 64,
                    ReleaseProbe::on_release, &probes[0]),
                StatusCode::invalid_argument);
  EXPECT_STATUS(plugin().copy_to_device_until_released(
                    kDevice, 0, source.data(), 64, ReleaseProbe::on_release,
                    &probes[1]),
                StatusCode::invalid_argument);
  EXPECT_STATUS(plugin().copy_to_device_until_released(
                    device_count(), *base, source.data(), 64,
                    ReleaseProbe::on_release, &probes[2]),
                StatusCode::no_such_device);
  ASSERT_OK(plugin().synchronize(kDevice));
  EXPECT_TRUE(ReleasedExactlyOnce(probes[0], kFailedBySynchronize)) << "range past the end";
  EXPECT_TRUE(ReleasedExactlyOnce(probes[1], kFailedBySynchronize)) << "address 0";
  EXPECT_OK(plugin().deallocate(kDevice, *base));
  destroy_plugin();
  EXPECT_TRUE(ReleasedExactlyOnce(probes[0], kFailedByDestroy)) << "range past the end";
  EXPECT_TRUE(ReleasedExactlyOnce(probes[1], kFailedByDestroy)) << "address 0";
  EXPECT_TRUE(ReleasedExactlyOnce(probes[2], kFailedByDestroy)) << "no such device";
}

TEST_F(UntilReleased, ZeroByteCopy_IsStillReleasedExactlyOnce) {
  auto& probe = keep_past_destroy<ReleaseProbe>();
  ASSERT_OK(plugin().copy_to_device_until_released(
      kDevice, 0, nullptr, 0, ReleaseProbe::on_release, &probe));
  ASSERT_OK(plugin().synchronize(kDevice));
  EXPECT_TRUE(ReleasedExactlyOnce(probe, kBySynchronize));
  destroy_plugin();
  EXPECT_TRUE(ReleasedExactlyOnce(probe, kByDestroy));
}

TEST_F(UntilReleased, DestroyWithCopiesInFlight_ReleasesEveryCopyExactlyOnceBeforeReturning) {
  constexpr int kCopies = 64;
  constexpr uint64_t kChunk = 256 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources[i] = pattern(kChunk, i);
    probes[i].arm(sources[i]);
    ASSERT_OK(plugin().copy_to_device_until_released(
        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
        ReleaseProbe::on_release, &probes[i]));
  }
  destroy_plugin();
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], kByDestroy)) << "copy " << i;
    EXPECT_TRUE(probes[i].source_intact) << "copy " << i;
  }
}

TEST_F(UntilReleased, CopyWithoutACallback_LandsBySynchronize) {
  constexpr uint64_t kSize = 256 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(base);
  auto& source = keep_past_destroy<std::vector<uint8_t>>(pattern(kSize, 7));
  ASSERT_OK(plugin().copy_to_device_until_released(
      kDevice, *base, source.data(), kSize, nullptr, nullptr));
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<std::vector<uint8_t>> read = read_device(kDevice, *base, kSize);
  ASSERT_OK(read);
  EXPECT_TRUE(BytesEqual(source, *read));
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

}  // namespace
}  // namespace devalloc::conformance
