// PLUGIN-11 (base + k is a copy address), PLUGIN-15, PLUGIN-16: what a copy
// writes, where, and what it refuses.
#include "suite.hpp"

#include <cstring>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

namespace devalloc::conformance {
namespace {

using RoundTrip = DeviceTest;
using Copy = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(RoundTrip, "PLUGIN-11, PLUGIN-15, PLUGIN-16");
DEVALLOC_CONFORMANCE_RULES(Copy, "PLUGIN-15, PLUGIN-16");

constexpr uint64_t kRoundTripSizes[] = {0, 1, 3, 255, 4096 + 7, kMiB + 13};

TEST_F(RoundTrip, AcrossSizes_DeviceGivesBackWhatTheHostWrote) {
  for (uint64_t nbytes : kRoundTripSizes) {
    SCOPED_TRACE(std::to_string(nbytes) + " bytes");
    Result<uint64_t> base = plugin().allocate(kDevice, nbytes, 0);
    ASSERT_OK(base);
    const auto& written =
        keep_past_destroy<std::vector<uint8_t>>(pattern(nbytes, nbytes));
    ASSERT_OK(plugin().copy_to_device(kDevice, *base, written.data(), nbytes));
    Result<std::vector<uint8_t>> read = read_device(kDevice, *base, nbytes);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(written, *read));
    EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
  }
}

TEST_F(RoundTrip, UntilReleasedSourceAcrossSizes_DeviceGivesBackWhatTheHostWrote) {
  constexpr size_t kCount = std::size(kRoundTripSizes);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCount);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const uint64_t nbytes = kRoundTripSizes[i];
    SCOPED_TRACE(std::to_string(nbytes) + " bytes");
    Result<uint64_t> base = plugin().allocate(kDevice, nbytes, 0);
    ASSERT_OK(base);
    sources[i] = pattern(nbytes, nbytes);
    probes[i].arm(sources[i]);
    ASSERT_OK(plugin().copy_to_device_until_released(
        kDevice, *base, sources[i].data(), nbytes, ReleaseProbe::on_release,
        &probes[i]));
    ASSERT_OK(plugin().synchronize(kDevice));
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], kBySynchronize));
    Result<std::vector<uint8_t>> read = read_device(kDevice, *base, nbytes);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(sources[i], *read));
    EXPECT_OK(plugin().deallocate(kDevice, *base));
  }
  destroy_plugin();
  for (const ReleaseProbe& probe : probes) {
    EXPECT_TRUE(ReleasedExactlyOnce(probe, kByDestroy));
  }
}

TEST_F(RoundTrip, AtUnalignedOffsets_CopyWritesExactlyItsRange) {
  constexpr uint64_t kSize = 16 * kKiB;
  constexpr uint64_t kLength = 1001;
  Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(base);
  const auto& background =
      keep_past_destroy<std::vector<uint8_t>>(pattern(kSize, 1));
  ASSERT_OK(plugin().copy_to_device(kDevice, *base, background.data(), kSize));
  std::vector<uint8_t> expected = background;
  for (uint64_t offset : {1u, 3u, 5u, 7u, 255u, 4097u, 15u * 1024 + 5}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const auto& chunk =
        keep_past_destroy<std::vector<uint8_t>>(pattern(kLength, offset));
    ASSERT_OK(plugin().copy_to_device(kDevice, *base + offset, chunk.data(),
                                      kLength));
    std::memcpy(expected.data() + offset, chunk.data(), kLength);
    Result<std::vector<uint8_t>> read = read_device(kDevice, *base, kSize);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(expected, *read));
  }
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

TEST_F(RoundTrip, ReadFromAnUnalignedOffsetIntoAnUnalignedHostPointer_GetsThoseBytes) {
  constexpr uint64_t kSize = 8 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(base);
  const auto& written = keep_past_destroy<std::vector<uint8_t>>(pattern(kSize, 2));
  ASSERT_OK(plugin().copy_to_device(kDevice, *base, written.data(), kSize));
  for (uint64_t offset : {1u, 3u, 4093u}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    constexpr uint64_t kLength = 97;
    std::vector<uint8_t> host(kLength + 2, 0);
    ASSERT_OK(plugin().copy_to_host(kDevice, host.data() + 1, *base + offset,
                                    kLength));
    EXPECT_EQ(host.front(), 0) << "wrote before dst";
    EXPECT_EQ(host.back(), 0) << "wrote past dst + nbytes";
    EXPECT_TRUE(BytesEqual(
        std::span<const uint8_t>(written).subspan(offset, kLength),
        std::span<const uint8_t>(host).subspan(1, kLength)));
  }
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

TEST_F(RoundTrip, EveryDevice_KeepsItsOwnBytes) {
  constexpr uint64_t kSize = 64 * kKiB;
  std::vector<uint64_t> bases;
  auto& written = keep_past_destroy<std::vector<std::vector<uint8_t>>>();
  for (uint32_t device = 0; device < device_count(); ++device) {
    Result<uint64_t> base = plugin().allocate(device, kSize, 0);
    ASSERT_OK(base) << "device " << device;
    written.push_back(pattern(kSize, 100 + device));
    ASSERT_OK(plugin().copy_to_device(device, *base, written.back().data(), kSize));
    bases.push_back(*base);
  }
  for (uint32_t device = 0; device < device_count(); ++device) {
    SCOPED_TRACE("device " + std::to_string(device));
    ASSERT_OK(plugin().synchronize(device));
    Result<std::vector<uint8_t>> read = read_device(device, bases[device], kSize);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(written[device], *read));
    EXPECT_OK(plugin().deallocate(device, bases[device]));
  }
}

TEST_F(Copy, ReadBackWithoutSynchronize_SeesEveryEarlierCopyOfTheSameThread) {
  constexpr int kCopies = 32;
  constexpr uint64_t kChunk = kMiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources[i] = pattern(kChunk, i);
    probes[i].arm(sources[i]);
  }
  // Issued back to back, so that an asynchronous plugin still has most of
  // them in flight when the reads begin.
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_OK(plugin().copy_to_device_until_released(
        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
        ReleaseProbe::on_release, &probes[i]));
  }
  // Newest first: the copies most likely still queued in a plugin that
  // forgets to order reads after them.
  for (int i = kCopies - 1; i >= 0; --i) {
    Result<std::vector<uint8_t>> read =
        read_device(kDevice, *base + i * kChunk, kChunk);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(sources[i], *read)) << "copy " << i;
  }
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

TEST_F(Copy, ZeroBytes_IsANoOpWhateverTheAddresses) {
  EXPECT_OK(plugin().copy_to_device(kDevice, 0, nullptr, 0));
  EXPECT_OK(plugin().copy_to_host(kDevice, nullptr, 0, 0));
}

TEST_F(Copy, RangeReachingPastTheEndOfAnAllocation_IsAnInvalidArgument) {
  Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(base);
  auto& host = keep_past_destroy<std::vector<uint8_t>>(8192);
  const std::pair<uint64_t, uint64_t> ranges[] = {
      {0, 4097}, {4095, 2}, {4096, 1}, {1, std::numeric_limits<uint64_t>::max()}};
  for (const auto& [offset, nbytes] : ranges) {
    SCOPED_TRACE(::testing::Message()
                 << "offset " << offset << ", " << nbytes << " bytes");
    EXPECT_STATUS(plugin().copy_to_device(kDevice, *base + offset, host.data(),
                                          nbytes),
                  StatusCode::invalid_argument);
    EXPECT_STATUS(plugin().copy_to_host(kDevice, host.data(), *base + offset,
                                        nbytes),
                  StatusCode::invalid_argument);
  }
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

TEST_F(Copy, AddressOutsideEveryLiveAllocation_IsAnInvalidArgument) {
  Result<uint64_t> freed = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(freed);
  ASSERT_OK(plugin().deallocate(kDevice, *freed));
  auto& host = keep_past_destroy<std::vector<uint8_t>>(16);
  for (uint64_t address : {uint64_t{0}, *freed}) {
    SCOPED_TRACE(::testing::Message() << "address 0x" << std::hex << address);
    EXPECT_STATUS(plugin().copy_to_device(kDevice, address, host.data(), 16),
                  StatusCode::invalid_argument);
    EXPECT_STATUS(plugin().copy_to_host(kDevice, host.data(), address, 16),
                  StatusCode::invalid_argument);
  }
}

TEST_F(Copy, NullHostPointerWithBytes_IsAnInvalidArgument) {
  Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(base);
  EXPECT_STATUS(plugin().copy_to_device(kDevice, *base, nullptr, 16),
                StatusCode::invalid_argument);
  EXPECT_STATUS(plugin().copy_to_host(kDevice, nullptr, *base, 16),
                StatusCode::invalid_argument);
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

TEST_F(Copy, DeviceIndexAtTheCount_IsNoSuchDevice) {
  Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(base);
  auto& host = keep_past_destroy<std::vector<uint8_t>>(16);
  EXPECT_STATUS(plugin().copy_to_device(device_count(), *base, host.data(), 16),
                StatusCode::no_such_device);
  EXPECT_STATUS(plugin().copy_to_host(device_count(), host.data(), *base, 16),
                StatusCode::no_such_device);
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

}  // namespace
}  // namespace devalloc::conformance
