// PLUGIN-10 (ABI 1.1): the optional get_memory_info reports free and total
// memory of a device, free at most total.
#include "suite.hpp"

namespace devalloc::conformance {
namespace {

class MemoryInfo : public DeviceTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DeviceTest::SetUp());
    if (api().struct_size < DEVALLOC_PLUGIN_API_V1_1_SIZE ||
        api().get_memory_info == nullptr) {
      GTEST_SKIP() << "plugin offers no get_memory_info (optional, ABI 1.1)";
    }
  }
};
DEVALLOC_CONFORMANCE_RULES(MemoryInfo, "PLUGIN-10");

TEST_F(MemoryInfo, EveryDevice_ReportsFreeAtMostTotalAndANonZeroTotal) {
  for (uint32_t device = 0; device < device_count(); ++device) {
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
    RawError error;
    ASSERT_EQ(api().get_memory_info(instance(), device, &free_bytes, &total_bytes,
                                    error.get()),
              DEVALLOC_STATUS_OK)
        << "device " << device << ": " << error.text();
    EXPECT_TRUE(error.untouched()) << "success wrote the error message (PLUGIN-6)";
    EXPECT_GT(total_bytes, 0u) << "device " << device << ": total memory 0 (PLUGIN-10)";
    EXPECT_LE(free_bytes, total_bytes)
        << "device " << device << ": more memory free than the device has (PLUGIN-10)";
  }
}

TEST_F(MemoryInfo, DeviceAtTheCount_IsNoSuchDeviceWithAMessage) {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
  RawError error;
  EXPECT_TRUE(RawFailure(api().get_memory_info(instance(), device_count(), &free_bytes,
                                               &total_bytes, error.get()),
                         DEVALLOC_STATUS_NO_SUCH_DEVICE, error));
}

TEST_F(MemoryInfo, NullOutputs_AreAnInvalidArgumentWithAMessage) {
  uint64_t bytes = 0;
  RawError free_null;
  EXPECT_TRUE(RawFailure(api().get_memory_info(instance(), kDevice, nullptr, &bytes,
                                               free_null.get()),
                         DEVALLOC_STATUS_INVALID_ARGUMENT, free_null))
      << "free_bytes NULL";
  RawError total_null;
  EXPECT_TRUE(RawFailure(api().get_memory_info(instance(), kDevice, &bytes, nullptr,
                                               total_null.get()),
                         DEVALLOC_STATUS_INVALID_ARGUMENT, total_null))
      << "total_bytes NULL";
}

}  // namespace
}  // namespace devalloc::conformance
