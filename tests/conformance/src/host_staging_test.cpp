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
