// PLUGIN-18: host staging memory, offered together with its capability flag.
#include "suite.hpp"

#include <vector>

namespace devalloc::conformance {
namespace {

class HostStaging : public DeviceTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DeviceTest::SetUp());
    if (!plugin().capabilities().host_staging) {
      GTEST_SKIP() << "plugin offers no host staging";
    }
  }
};
DEVALLOC_CONFORMANCE_RULES(HostStaging, "PLUGIN-18");

TEST_F(HostStaging, Buffer_IsWritableAndServesAsAnUntilReleasedSource) {
  constexpr uint64_t kSize = kMiB;
  Result<void*> host = plugin().allocate_host(kSize);
  ASSERT_OK(host);
  ASSERT_NE(*host, nullptr);
  Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(base);
  std::span<uint8_t> staging(static_cast<uint8_t*>(*host), kSize);
  fill_pattern(staging, 3);
  auto& probe = keep_past_destroy<ReleaseProbe>();
  probe.arm(staging);
  ASSERT_OK(plugin().copy_to_device_until_released(
      kDevice, *base, staging.data(), kSize, ReleaseProbe::on_release, &probe));
  ASSERT_OK(plugin().synchronize(kDevice));
  EXPECT_TRUE(ReleasedExactlyOnce(probe, kBySynchronize));
  EXPECT_OK(plugin().free_host(*host));
  Result<std::vector<uint8_t>> read = read_device(kDevice, *base, kSize);
  ASSERT_OK(read);
  EXPECT_TRUE(BytesEqual(pattern(kSize, 3), *read));
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

// The host keeps one ring of staging buffers per plugin instance and copies
// from any slot to any of its devices: one buffer from allocate_host is the
// source of copies to every device, both kinds, parts of it to each.
TEST_F(HostStaging, OneBuffer_ServesCopiesToEveryDevice) {
  constexpr uint64_t kPart = 64 * kKiB;
  const uint32_t devices = device_count();
  Result<void*> host = plugin().allocate_host(2 * kPart * devices);
  ASSERT_OK(host);
  std::span<uint8_t> staging(static_cast<uint8_t*>(*host), 2 * kPart * devices);
  fill_pattern(staging, 11);
  // Compared with a copy: once released, the staging memory is the host's
  // again (the validation layer's source check overwrites it then).
  const std::vector<uint8_t> written(staging.begin(), staging.end());
  std::vector<uint64_t> bases;
  for (uint32_t device = 0; device < devices; ++device) {
    Result<uint64_t> base = plugin().allocate(device, 2 * kPart, 0);
    ASSERT_OK(base) << " on device " << device;
    bases.push_back(*base);
    std::span<uint8_t> part = staging.subspan(2 * kPart * device, 2 * kPart);
    auto& probe = keep_past_destroy<ReleaseProbe>();
    probe.arm(part.first(kPart));
    ASSERT_OK(plugin().copy_to_device_until_released(device, *base, part.data(), kPart,
                                                     ReleaseProbe::on_release, &probe))
        << " to device " << device;
    ASSERT_OK(plugin().copy_to_device(device, *base + kPart, part.data() + kPart, kPart))
        << " to device " << device;
    ASSERT_OK(plugin().synchronize(device));
    EXPECT_TRUE(ReleasedExactlyOnce(probe, kBySynchronize)) << " device " << device;
  }
  for (uint32_t device = 0; device < devices; ++device) {
    Result<std::vector<uint8_t>> read = read_device(device, bases[device], 2 * kPart);
    ASSERT_OK(read);
    EXPECT_TRUE(BytesEqual(std::span<const uint8_t>(written).subspan(2 * kPart * device, 2 * kPart),
                           *read))
        << " device " << device;
    EXPECT_OK(plugin().deallocate(device, bases[device]));
  }
  EXPECT_OK(plugin().free_host(*host));
}

TEST_F(HostStaging, ZeroBytes_GivesNull_WhichFreesAsANoOp) {
  Result<void*> host = plugin().allocate_host(0);
  ASSERT_OK(host);
  EXPECT_EQ(*host, nullptr);
  EXPECT_OK(plugin().free_host(nullptr));
}

TEST_F(HostStaging, FreeingAPointerAllocateHostDidNotReturn_IsAnInvalidArgument) {
  std::vector<uint8_t> ordinary(64);
  EXPECT_STATUS(plugin().free_host(ordinary.data()), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace devalloc::conformance
