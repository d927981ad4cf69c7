// PLUGIN-11, PLUGIN-12: allocate and deallocate.
#include "suite.hpp"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace devalloc::conformance {
namespace {

using Allocation = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(Allocation, "PLUGIN-11, PLUGIN-12");

constexpr uint64_t kNaturalAlignment = 256;

TEST_F(Allocation, ZeroBytes_SucceedsWithAddress0_WhichFreesAsANoOp) {
  Result<uint64_t> address = plugin().allocate(kDevice, 0, 0);
  ASSERT_OK(address);
  EXPECT_EQ(*address, 0u);
  EXPECT_OK(plugin().deallocate(kDevice, *address));
}

TEST_F(Allocation, SizesFrom1ByteTo1MiB_GetDisjointNaturallyAlignedRanges) {
  const std::vector<uint64_t> sizes = {1, 7, 4096, kMiB};
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t nbytes : sizes) {
    Result<uint64_t> address = plugin().allocate(kDevice, nbytes, 0);
    ASSERT_OK(address);
    EXPECT_NE(*address, 0u) << nbytes << " bytes";
    EXPECT_EQ(*address % kNaturalAlignment, 0u)
        << nbytes << " bytes at 0x" << std::hex << *address;
    ranges.emplace_back(*address, nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first)
        << "two live allocations overlap";
  }
  for (const auto& [address, nbytes] : ranges) {
    EXPECT_OK(plugin().deallocate(kDevice, address));
  }
}

TEST_F(Allocation, EveryPowerOfTwoAlignmentUpToMaxAlignment_IsHonoured) {
  const uint64_t max_alignment = plugin().capabilities().max_alignment;
  ASSERT_GE(max_alignment, kNaturalAlignment);
  for (uint64_t alignment = 1; alignment != 0 && alignment <= max_alignment;
       alignment <<= 1) {
    Result<uint64_t> address = plugin().allocate(kDevice, 3, alignment);
    ASSERT_OK(address) << "alignment " << alignment;
    EXPECT_EQ(*address % alignment, 0u)
        << "alignment " << alignment << " at 0x" << std::hex << *address;
    EXPECT_OK(plugin().deallocate(kDevice, *address));
  }
}

TEST_F(Allocation, AlignmentAboveMaxAlignment_IsUnsupported) {
  const uint64_t max_alignment = plugin().capabilities().max_alignment;
  if (max_alignment > std::numeric_limits<uint64_t>::max() / 2) {
    GTEST_SKIP() << "max_alignment " << max_alignment
                 << " leaves no larger power of two";
  }
  EXPECT_STATUS(plugin().allocate(kDevice, 64, max_alignment * 2),
                StatusCode::unsupported);
}

TEST_F(Allocation, AlignmentThatIsNotAPowerOfTwo_IsAnInvalidArgument) {
  for (uint64_t alignment : {3u, 6u, 24u, 255u, 257u, 3u << 20}) {
    EXPECT_STATUS(plugin().allocate(kDevice, 64, alignment),
                  StatusCode::invalid_argument)
        << "alignment " << alignment;
  }
}

TEST_F(Allocation, SizeNoDeviceCouldHold_IsOutOfDeviceMemoryNotACrash) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  // The last one overflows when rounded up to its alignment.
  const std::pair<uint64_t, uint64_t> requests[] = {
      {kMax, 0}, {kMax / 2, 0}, {kMax - 100, 4096}};
  for (const auto& [nbytes, alignment] : requests) {
    EXPECT_STATUS(plugin().allocate(kDevice, nbytes, alignment),
                  StatusCode::out_of_device_memory)
        << nbytes << " bytes, alignment " << alignment;
  }
}

TEST_F(Allocation, DeviceIndexAtOrBeyondTheCount_IsNoSuchDevice) {
  for (uint32_t device : {device_count(), std::numeric_limits<uint32_t>::max()}) {
    EXPECT_STATUS(plugin().allocate(device, 64, 0), StatusCode::no_such_device)
        << "device " << device;
    EXPECT_STATUS(plugin().deallocate(device, 0), StatusCode::no_such_device)
        << "device " << device;
  }
}

TEST_F(Allocation, FreeingAnAddressAllocateDidNotReturn_IsAnInvalidArgument) {
  Result<uint64_t> address = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(address);
  EXPECT_STATUS(plugin().deallocate(kDevice, *address + 1),
                StatusCode::invalid_argument);
  EXPECT_STATUS(plugin().deallocate(kDevice, *address + 4096),
                StatusCode::invalid_argument);
  EXPECT_OK(plugin().deallocate(kDevice, *address));
}

TEST_F(Allocation, FreeingTwice_IsAnInvalidArgument) {
  Result<uint64_t> address = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(address);
  ASSERT_OK(plugin().deallocate(kDevice, *address));
  EXPECT_STATUS(plugin().deallocate(kDevice, *address),
                StatusCode::invalid_argument);
}

TEST_F(Allocation, FreeingOnAnotherDevice_IsAnInvalidArgument) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  Result<uint64_t> address = plugin().allocate(kDevice, 4096, 0);
  ASSERT_OK(address);
  EXPECT_STATUS(plugin().deallocate(kDevice + 1, *address),
                StatusCode::invalid_argument);
  EXPECT_OK(plugin().deallocate(kDevice, *address));
}

}  // namespace
}  // namespace devalloc::conformance
