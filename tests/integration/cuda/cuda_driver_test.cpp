// What the plugin makes of the driver it finds: none, a broken or old one,
// one without devices, and the properties and errors of a working one.
#include "cuda_fixture.hpp"

#include <optional>
#include <set>

namespace devalloc::cuda_test {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CudaDriver,
     NoDriverAtThePath_CreateIsRuntimeUnavailableNamingTheFileAndTheReason) {
  auto [plugin, error] = load_cuda_plugin("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(plugin);
  EXPECT_EQ(error.outcome, PluginOutcome::create_failed);
  EXPECT_EQ(error.status.code(), StatusCode::runtime_unavailable);
  const std::string& message = error.status.message();
  EXPECT_TRUE(contains(message,
                       "cuda: cannot open the CUDA driver "
                       "\"/nonexistent/libcuda.so.1\": "))
      << message;
  EXPECT_TRUE(contains(message, "No such file or directory")) << message;
}

TEST(
    CudaDriver,
    DriverThatFailsToInitialize_CreateIsRuntimeUnavailableNamingCuInitAndTheError) {
  auto [plugin, error] =
      load_cuda_plugin(kFakeDir + "/driver_mismatch/libcuda.so.1");
  ASSERT_FALSE(plugin);
  EXPECT_EQ(error.status.code(), StatusCode::runtime_unavailable);
  EXPECT_TRUE(contains(error.status.message(),
                       "cuda: cuInit(Flags = 0) failed: "
                       "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH ("))
      << error.status.message();
}

TEST(CudaDriver,
     DriverWithoutAVersionedEntryPoint_CreateIsRuntimeUnavailableNamingIt) {
  const std::string driver = kFakeDir + "/without_uuid_v2/libcuda.so.1";
  auto [plugin, error] = load_cuda_plugin(driver);
  ASSERT_FALSE(plugin);
  EXPECT_EQ(error.status.code(), StatusCode::runtime_unavailable);
  EXPECT_TRUE(contains(error.status.message(), "\"" + driver +
                                                   "\" has no entry point "
                                                   "cuDeviceGetUuid_v2"))
      << error.status.message();
}

TEST(CudaDriver, DriverWithoutDevices_CreateSucceedsWithNoDeviceAndNoStaging) {
  auto [plugin, error] = load_cuda_plugin(kFakeDir + "/no_device/libcuda.so.1");
  ASSERT_TRUE(plugin) << error.status.message();
  EXPECT_TRUE(plugin->devices().empty());
  EXPECT_FALSE(plugin->capabilities().host_staging);
  EXPECT_EQ(plugin->allocate(0, 256, 0).status().code(),
            StatusCode::no_such_device);
  EXPECT_EQ(plugin->allocate_host(4096).status().code(),
            StatusCode::unsupported);
}

TEST(CudaDriver, UnknownOption_IsAnInvalidArgumentNamingItAndTheAcceptedOne) {
  auto [plugin, error] =
      load_cuda_plugin(kFakeDriver, {{"runtime_libary", "libcuda.so.1"}});
  ASSERT_FALSE(plugin);
  EXPECT_EQ(error.status.code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(error.status.message(), "\"runtime_libary\""))
      << error.status.message();
  EXPECT_TRUE(contains(error.status.message(), "runtime_library"))
      << error.status.message();
}

using CudaDevices = CudaPluginTest;

TEST_F(CudaDevices, Properties_ComeFromTheDriver_PciBusIdInTheAbisForm) {
  const auto& devices = plugin().devices();
  ASSERT_EQ(devices.size(), 2u);
  std::set<std::string> uuids;
  for (const DeviceInfo& device : devices) {
    const std::string n = std::to_string(device.index);
    EXPECT_EQ(device.name, "Fake CUDA Device " + n);
    EXPECT_EQ(device.total_memory_bytes, uint64_t{1} << 30);
    EXPECT_TRUE(device.has_uuid());
    uuids.insert(device.uuid_string());
    // The fake answers "0000:1A:00.0", as the driver does.
    EXPECT_EQ(device.pci_bus_id,
              device.index == 0 ? "0000:1a:00.0" : "0000:1b:00.0");
    EXPECT_EQ(device.dlpack_device_type, DEVALLOC_DLPACK_CUDA);
    EXPECT_EQ(device.dlpack_device_id, static_cast<int32_t>(device.index));
  }
  EXPECT_EQ(uuids.size(), devices.size());
}

TEST_F(CudaDevices,
       AllocationBeyondDeviceMemory_IsOutOfDeviceMemoryInTheDriversWords) {
  const Result<uint64_t> address = plugin().allocate(1, uint64_t{2} << 30, 0);
  EXPECT_EQ(address.status().code(), StatusCode::out_of_device_memory);
  EXPECT_TRUE(contains(address.status().message(),
                       "device 1: cuMemAlloc_v2(bytesize = 2147483648) failed: "
                       "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"))
      << address.status().message();
}

TEST_F(CudaDevices,
       AlignmentAboveWhatTheDriverGives_IsHonouredAndTheWholeRangeUsable) {
  // The fake aligns to 256 bytes and never to 512.
  for (uint64_t alignment :
       {uint64_t{512}, uint64_t{4096}, plugin().capabilities().max_alignment}) {
    constexpr uint64_t kBytes = 3000;
    const Result<uint64_t> address = plugin().allocate(0, kBytes, alignment);
    ASSERT_TRUE(address.ok()) << address.status().message();
    EXPECT_EQ(*address % alignment, 0u) << "alignment " << alignment;
    const std::vector<uint8_t> bytes =
        pattern(kBytes, static_cast<int>(alignment));
    ASSERT_TRUE(
        plugin().copy_to_device(0, *address, bytes.data(), kBytes).ok());
    EXPECT_EQ(fake().read(*address, kBytes), bytes);
    EXPECT_TRUE(plugin().deallocate(0, *address).ok());
  }
  EXPECT_EQ(fake().live_allocations(-1), 0u);
}

TEST_F(CudaDevices,
       CopyOutsideEveryAllocation_IsRefusedBeforeReachingTheDriver) {
  const Result<uint64_t> address = plugin().allocate(0, 4096, 0);
  ASSERT_TRUE(address.ok());
  const std::vector<uint8_t> bytes(64);
  const uint64_t before = fake().calls("cuMemcpyHtoDAsync_v2");
  const Status status =
      plugin().copy_to_device(0, *address + 4096 - 32, bytes.data(), 64);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument);
  EXPECT_EQ(fake().calls("cuMemcpyHtoDAsync_v2"), before);
  EXPECT_TRUE(plugin().deallocate(0, *address).ok());
}

// Pinned staging that the driver cannot give for lack of memory is host
// memory that ran out, not device memory nor a device error.
TEST_F(CudaDevices, PinnedAllocationOutOfMemory_IsOutOfHostMemoryNamingCuMemHostAlloc) {
  fake().fail_next("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY);
  const Result<void*> pinned = plugin().allocate_host(4096);
  EXPECT_EQ(pinned.status().code(), StatusCode::out_of_host_memory);
  EXPECT_TRUE(contains(pinned.status().message(),
                       "cuMemHostAlloc(bytesize = 4096, Flags = CU_MEMHOSTALLOC_PORTABLE) failed: "
                       "CUDA_ERROR_OUT_OF_MEMORY"))
      << pinned.status().message();
}

// A driver that answers CUDA_SUCCESS without memory (a null pointer):
// the plugin hands out no address 0 and no NULL staging buffer, which the
// host would blame on the plugin (PLUGIN-11, PLUGIN-18) or write through,
// but fails naming the driver call; it keeps nothing to free at destroy.
TEST_F(CudaDevices, AllocationAnsweredSuccessWithoutMemory_IsADeviceErrorNamingTheCall) {
  fake().null_result_next("cuMemAlloc_v2");
  const Result<uint64_t> address = plugin().allocate(1, 4096, 0);
  ASSERT_FALSE(address.ok()) << "handed out address 0x" << std::hex << *address;
  EXPECT_EQ(address.status().code(), StatusCode::device_error);
  EXPECT_TRUE(contains(address.status().message(),
                       "cuMemAlloc_v2(bytesize = 4096) returned CUDA_SUCCESS without memory "
                       "(a null pointer)"))
      << address.status().message();

  fake().null_result_next("cuMemHostAlloc");
  const Result<void*> pinned = plugin().allocate_host(4096);
  ASSERT_FALSE(pinned.ok());
  EXPECT_EQ(pinned.status().code(), StatusCode::device_error);
  EXPECT_TRUE(contains(pinned.status().message(),
                       "cuMemHostAlloc(bytesize = 4096, Flags = CU_MEMHOSTALLOC_PORTABLE) "
                       "returned CUDA_SUCCESS without memory (a null pointer)"))
      << pinned.status().message();

  // The next allocations work, and destroy frees nothing it was not given.
  const Result<uint64_t> good = plugin().allocate(1, 4096, 0);
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_TRUE(plugin().deallocate(1, *good).ok());
  destroy_plugin();
  EXPECT_EQ(fake().calls("cuMemFree_v2"), 1u);
  EXPECT_EQ(fake().calls("cuMemFreeHost"), 0u);
}

#if DEVALLOC_ABI_VERSION_MINOR >= 1
TEST_F(CudaDevices, MemoryInfo_IsCuMemGetInfoOfTheDeviceAsked) {
  constexpr uint64_t kTotal = uint64_t{1} << 30, kBytes = uint64_t{1} << 20;
  const Result<std::optional<MemoryInfo>> before = plugin().memory_info(1);
  ASSERT_TRUE(before.ok()) << before.status().message();
  ASSERT_TRUE((*before).has_value()) << "the CUDA plugin offers get_memory_info";
  EXPECT_EQ((*before)->total_bytes, kTotal);
  EXPECT_EQ((*before)->free_bytes, kTotal);
  const Result<uint64_t> address = plugin().allocate(1, kBytes, 0);
  ASSERT_TRUE(address.ok());
  const Result<std::optional<MemoryInfo>> after = plugin().memory_info(1);
  ASSERT_TRUE(after.ok() && (*after).has_value());
  EXPECT_EQ((*after)->free_bytes, kTotal - kBytes);
  const Result<std::optional<MemoryInfo>> other = plugin().memory_info(0);
  ASSERT_TRUE(other.ok() && (*other).has_value());
  EXPECT_EQ((*other)->free_bytes, kTotal) << "device 0 reported device 1's memory";
  EXPECT_TRUE(plugin().deallocate(1, *address).ok());
}
#endif

}  // namespace
}  // namespace devalloc::cuda_test
