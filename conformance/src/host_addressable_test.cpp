// PLUGIN-18 (ABI 1.1): with DEVALLOC_CAPABILITY_HOST_ADDRESSABLE a device
// address is a host pointer the host may write and read directly while no
// copy into the range is in flight.
#include "suite.hpp"

#include <cstring>
#include <vector>

namespace devalloc::conformance {
namespace {

class HostAddressable : public DeviceTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DeviceTest::SetUp());
    // The flag means something only from ABI 1.1 on: a plugin that
    // negotiated 1.0 and sets it is not trusted (writing through its
    // addresses may crash the suite), and fails
    // Capabilities.FlagsItsNegotiatedMinorDoesNotDefine_AreNotSet instead.
    if (plugin().abi_minor() < 1) {
      GTEST_SKIP() << "plugin negotiated ABI 1." << plugin().abi_minor()
                   << ", which has no DEVALLOC_CAPABILITY_HOST_ADDRESSABLE (added in 1.1)";
    }
    if (!plugin().capabilities().host_addressable) {
      GTEST_SKIP() << "plugin does not set DEVALLOC_CAPABILITY_HOST_ADDRESSABLE";
    }
  }

  static uint8_t* pointer(uint64_t address) {
    return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(address));
  }
};
DEVALLOC_CONFORMANCE_RULES(HostAddressable, "PLUGIN-18");

TEST_F(HostAddressable, BytesWrittenThroughTheAddress_AreReadBackByCopyDeviceToHost) {
  constexpr uint64_t kSize = 4 * kKiB + 13;
  for (uint32_t device = 0; device < device_count(); ++device) {
    Result<uint64_t> base = plugin().allocate(device, kSize, 0);
    ASSERT_OK(base);
    const std::vector<uint8_t> bytes = pattern(kSize, 40 + device);
    std::memcpy(pointer(*base), bytes.data(), kSize);
    Result<std::vector<uint8_t>> read = read_device(device, *base, kSize);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(bytes, *read))
        << "device " << device
        << ": copy_device_to_host does not see bytes written through the address "
           "(PLUGIN-18: the flag promises host pointers)";
    EXPECT_OK(plugin().deallocate(device, *base));
  }
}

TEST_F(HostAddressable, BytesCopiedToTheDevice_AreSeenThroughTheAddressAfterSynchronize) {
  constexpr uint64_t kSize = 64 * kKiB + 5;
  Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(base);
  auto& source = keep_past_destroy<std::vector<uint8_t>>(pattern(kSize, 41));
  ASSERT_OK(plugin().copy_to_device_until_released(kDevice, *base, source.data(), kSize,
                                                   nullptr, nullptr));
  ASSERT_OK(plugin().synchronize(kDevice));
  EXPECT_TRUE(BytesEqual(source, std::span<const uint8_t>(pointer(*base), kSize)))
      << "after synchronize the address does not hold the copied bytes (PLUGIN-18)";
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

}  // namespace
}  // namespace devalloc::conformance
