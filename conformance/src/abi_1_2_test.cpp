// ABI 1.2: host mapping (PLUGIN-22) and DMA constraints (PLUGIN-23). The
// memories of one card (PLUGIN-24) are checked with the devices
// (devices_test.cpp).
#include "suite.hpp"

#include <cstring>
#include <vector>

namespace devalloc::conformance {
namespace {

bool negotiated_1_2(const Plugin& plugin) { return plugin.abi_minor() >= 2; }

class HostMapping : public DeviceTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DeviceTest::SetUp());
    if (!negotiated_1_2(plugin())) {
      GTEST_SKIP() << "plugin negotiated ABI 1." << plugin().abi_minor()
                   << ", which has no host mapping (added in 1.2)";
    }
    if (!plugin().capabilities().host_mappable) {
      GTEST_SKIP() << "plugin does not set DEVALLOC_CAPABILITY_HOST_MAPPABLE";
    }
  }
};
DEVALLOC_CONFORMANCE_RULES(HostMapping, "PLUGIN-22");

TEST_F(HostMapping, BytesWrittenThroughAMapping_AreOnTheDeviceOnceUnmapped) {
  constexpr uint64_t kSize = 64 * kKiB + 9;
  constexpr uint64_t kOffset = 4 * kKiB + 3;
  constexpr uint64_t kSpan = 16 * kKiB + 1;
  for (uint32_t device = 0; device < device_count(); ++device) {
    Result<uint64_t> base = plugin().allocate(device, kSize, 0);
    ASSERT_OK(base);
    const std::vector<uint8_t> bytes = pattern(kSpan, 60 + device);
    Result<void*> host = plugin().map_to_host(device, *base + kOffset, kSpan);
    ASSERT_OK(host);
    std::memcpy(*host, bytes.data(), kSpan);
    ASSERT_OK(plugin().unmap_from_host(device, *host));
    Result<std::vector<uint8_t>> read = read_device(device, *base + kOffset, kSpan);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(bytes, *read))
        << "device " << device
        << ": copy_device_to_host does not see the bytes written through the mapping after "
           "unmap_from_host returned (PLUGIN-22)";
    EXPECT_OK(synchronize_and_deallocate(device, *base));
  }
}

TEST_F(HostMapping, BytesCopiedToTheDevice_AreSeenThroughALaterMapping) {
  constexpr uint64_t kSize = 32 * kKiB + 7;
  Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(base);
  const std::vector<uint8_t> bytes = pattern(kSize, 61);
  ASSERT_OK(plugin().copy_to_device(kDevice, *base, bytes.data(), kSize));
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<void*> host = plugin().map_to_host(kDevice, *base, kSize);
  ASSERT_OK(host);
  EXPECT_TRUE(BytesEqual(bytes, std::span<const uint8_t>(static_cast<uint8_t*>(*host), kSize)))
      << "a mapping made after synchronize does not show the copied bytes (PLUGIN-22)";
  EXPECT_OK(plugin().unmap_from_host(kDevice, *host));
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

TEST_F(HostMapping, RangePastTheAllocation_IsInvalidArgumentWithAMessage) {
  constexpr uint64_t kSize = 8 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(base);
  devalloc_map_args args{};
  args.struct_size = sizeof args;
  args.device = kDevice;
  args.address = *base + kSize - 16;
  args.nbytes = 32;
  RawError error;
  EXPECT_TRUE(RawFailure(api().map_to_host(instance(), &args, error.get()),
                         DEVALLOC_STATUS_INVALID_ARGUMENT, error))
      << "a range that ends 16 bytes past its allocation was mapped (PLUGIN-22)";
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

TEST_F(HostMapping, UnmapOfAPointerNeverMapped_IsInvalidArgumentWithAMessage) {
  uint8_t not_mapped[64] = {};
  RawError error;
  EXPECT_TRUE(RawFailure(api().unmap_from_host(instance(), kDevice, not_mapped, error.get()),
                         DEVALLOC_STATUS_INVALID_ARGUMENT, error))
      << "unmap_from_host accepted a pointer that map_to_host never returned (PLUGIN-22)";
}

class CopyConstraints : public DeviceTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DeviceTest::SetUp());
    if (!negotiated_1_2(plugin())) {
      GTEST_SKIP() << "plugin negotiated ABI 1." << plugin().abi_minor()
                   << ", which states no DMA constraints (added in 1.2)";
    }
  }
};
DEVALLOC_CONFORMANCE_RULES(CopyConstraints, "PLUGIN-23");

TEST_F(CopyConstraints, AreAPowerOfTwoAlignmentAndSizesThatFit) {
  devalloc_capabilities caps{};
  caps.struct_size = sizeof caps;
  RawError error;
  ASSERT_EQ(api().get_capabilities(instance(), &caps, error.get()), DEVALLOC_STATUS_OK)
      << error.text();
  if (caps.copy_src_alignment != 0) {
    EXPECT_EQ(caps.copy_src_alignment & (caps.copy_src_alignment - 1), 0u)
        << "copy_src_alignment " << caps.copy_src_alignment << " is no power of two (PLUGIN-23)";
  }
  if (caps.copy_max_bytes != 0 && caps.copy_preferred_bytes != 0) {
    EXPECT_LE(caps.copy_preferred_bytes, caps.copy_max_bytes)
        << "the preferred transfer is larger than the largest (PLUGIN-23)";
  }
}

// A constraint is a preference: a copy that breaks it is still accepted.
TEST_F(CopyConstraints, ACopyThatBreaksThem_IsStillAcceptedAndLands) {
  const Capabilities& caps = plugin().capabilities();
  const uint64_t size =
      caps.copy_max_bytes != 0 ? 2 * caps.copy_max_bytes + 3 : uint64_t{256} * kKiB + 3;
  Result<uint64_t> base = plugin().allocate(kDevice, size, 0);
  ASSERT_OK(base);
  // One byte past an aligned start: off any alignment above 1.
  std::vector<uint8_t> storage(size + 64);
  const std::vector<uint8_t> bytes = pattern(size, 62);
  std::memcpy(storage.data() + 1, bytes.data(), size);
  ASSERT_OK(plugin().copy_to_device(kDevice, *base, storage.data() + 1, size));
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<std::vector<uint8_t>> read = read_device(kDevice, *base, size);
  ASSERT_OK(read);
  EXPECT_TRUE(BytesEqual(bytes, *read))
      << "a copy from an unaligned source larger than copy_max_bytes landed wrong (PLUGIN-23)";
  EXPECT_OK(synchronize_and_deallocate(kDevice, *base));
}

}  // namespace
}  // namespace devalloc::conformance
