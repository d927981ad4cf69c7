// The Level Zero plugin where the loader loads two drivers (the fake built
// twice: tests/fakes/level_zero), each with a non-GPU device between two
// GPUs: DEVALLOC_FAKE_ZE_DEVICES=3, DEVALLOC_FAKE_ZE_DEVICE_TYPES=gpu,vpu,gpu
// (set by CMakeLists.txt). Which devices it serves, in which order, and
// why it offers no staging memory there; and the fake catching host memory
// of one driver's context copied by another driver's command list.
#include "level_zero_fixture.hpp"

#include <level_zero/ze_api.h>

#include <vector>

namespace devalloc::level_zero_test {
namespace {

const std::string kSecondDriver = DEVALLOC_FAKE_ZE_SECOND_DRIVER;

// Both fake drivers, as the loader loaded them; every test ends with no
// violation left unexamined in either.
class TwoDrivers : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(zeInit(0), ZE_RESULT_SUCCESS);
    for (const std::string* path : {&kFakeDriver, &kSecondDriver}) {
      fakes_.push_back(std::make_unique<FakeZe>(*path));
      ASSERT_TRUE(fakes_.back()->loaded()) << "the loader did not load " << *path;
      fakes_.back()->reset();
    }
  }
  void TearDown() override {
    for (const auto& fake : fakes_) EXPECT_EQ(fake->violations(), "");
  }
  const FakeZe& fake(size_t driver) const { return *fakes_[driver]; }

 private:
  std::vector<std::unique_ptr<FakeZe>> fakes_;
};

class LevelZeroTwoDrivers : public TwoDrivers {
 protected:
  void SetUp() override {
    TwoDrivers::SetUp();
    if (HasFatalFailure()) return;
    auto [plugin, error] = PluginLoader().load(kPlugin, {{"runtime_library", "libze_loader.so.1"}});
    ASSERT_TRUE(plugin) << error.status.message();
    plugin_ = std::move(plugin);
  }
  void TearDown() override {
    plugin_.reset();
    TwoDrivers::TearDown();
  }
  Plugin& plugin() { return *plugin_; }

 private:
  std::shared_ptr<Plugin> plugin_;
};

// zeInit(0) initializes every driver, an NPU's too, and a loader before
// 1.18 or so hands them all out: the plugin serves GPU devices only, and
// numbers them in the loader's driver order.
TEST_F(LevelZeroTwoDrivers, NonGpuDevicesAreLeftOut_IndicesCountGpuDevicesInDriverOrder) {
  const auto& devices = plugin().devices();
  ASSERT_EQ(devices.size(), 4u) << "six devices, of which four GPUs";
  const std::string expected[4][3] = {
      {"Fake Level Zero Device 0", "1e7e1020-de5a-4000-8000-000000000000", "0000:3a:00.0"},
      {"Fake Level Zero Device 2", "1e7e1020-de5a-4000-8000-000000000002", "0000:3c:00.0"},
      {"Driver 1 Fake Level Zero Device 0", "1e7e1020-de5a-4000-8000-000000000100",
       "0000:5a:00.0"},
      {"Driver 1 Fake Level Zero Device 2", "1e7e1020-de5a-4000-8000-000000000102",
       "0000:5c:00.0"}};
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(devices[i].name, expected[i][0]) << i;
    EXPECT_EQ(devices[i].uuid_string(), expected[i][1]) << i;
    EXPECT_EQ(devices[i].pci_bus_id, expected[i][2]) << i;
    EXPECT_EQ(devices[i].dlpack_device_id, static_cast<int32_t>(i));
  }
}

// Host memory belongs to one context, and a copy's memory must be of its
// command list's context; with two drivers there are two contexts, and
// allocate_host cannot know which device will copy from the buffer.
TEST_F(LevelZeroTwoDrivers, DevicesOfTwoDrivers_NoStagingMemoryIsOffered) {
  EXPECT_FALSE(plugin().capabilities().host_staging);
  const Result<void*> staging = plugin().allocate_host(4096);
  ASSERT_FALSE(staging.ok());
  EXPECT_EQ(staging.status().code(), StatusCode::unsupported);
}

TEST_F(LevelZeroTwoDrivers, EveryDeviceOfBothDrivers_KeepsItsOwnBytes) {
  const uint32_t count = static_cast<uint32_t>(plugin().devices().size());
  std::vector<uint64_t> bases;
  for (uint32_t d = 0; d < count; ++d) {
    const Result<uint64_t> base = plugin().allocate(d, 4096, 0);
    ASSERT_TRUE(base.ok()) << base.status().message();
    bases.push_back(*base);
    const std::vector<uint8_t> bytes = pattern(4096, static_cast<int>(d));
    ASSERT_TRUE(plugin().copy_to_device(d, *base, bytes.data(), bytes.size()).ok()) << d;
  }
  for (uint32_t d = 0; d < count; ++d) {
    std::vector<uint8_t> back(4096);
    ASSERT_TRUE(plugin().copy_to_host(d, back.data(), bases[d], back.size()).ok()) << d;
    EXPECT_EQ(back, pattern(4096, static_cast<int>(d))) << d;
    EXPECT_TRUE(plugin().synchronize(d).ok());
    EXPECT_TRUE(plugin().deallocate(d, bases[d]).ok());
  }
}

// The fake's side: host memory of the first driver's context, copied by a
// command list of the second driver, is refused and recorded.
TEST_F(TwoDrivers, HostMemoryOfOneDriver_CopiedByAnotherDriversList_RefusedAndRecorded) {
  uint32_t count = 2;
  ze_driver_handle_t drivers[2] = {};
  ASSERT_EQ(zeDriverGet(&count, drivers), ZE_RESULT_SUCCESS);
  ASSERT_EQ(count, 2u);
  ze_context_handle_t contexts[2] = {};
  ze_device_handle_t device = nullptr;
  for (int d = 0; d < 2; ++d) {
    ze_context_desc_t desc = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
    ASSERT_EQ(zeContextCreate(drivers[d], &desc, &contexts[d]), ZE_RESULT_SUCCESS);
  }
  uint32_t one = 1;
  ASSERT_EQ(zeDeviceGet(drivers[1], &one, &device), ZE_RESULT_SUCCESS);
  ze_command_queue_desc_t queue = {};
  queue.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
  queue.mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
  ze_command_list_handle_t list = nullptr;
  ASSERT_EQ(zeCommandListCreateImmediate(contexts[1], device, &queue, &list), ZE_RESULT_SUCCESS);
  ze_device_mem_alloc_desc_t device_desc = {};
  device_desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  void* memory = nullptr;
  ASSERT_EQ(zeMemAllocDevice(contexts[1], &device_desc, 4096, 0, device, &memory),
            ZE_RESULT_SUCCESS);
  ze_host_mem_alloc_desc_t host_desc = {};
  host_desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  void* host = nullptr;
  ASSERT_EQ(zeMemAllocHost(contexts[0], &host_desc, 4096, 0, &host), ZE_RESULT_SUCCESS);

  EXPECT_EQ(zeCommandListAppendMemoryCopy(list, memory, host, 4096, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  const std::string violations = fake(1).violations();
  EXPECT_NE(violations.find("allocated (zeMemAllocHost) on a context of another driver"),
            std::string::npos)
      << violations;
  fake(1).reset();
  // Pageable memory is any context's.
  std::vector<uint8_t> pageable(4096, 7);
  EXPECT_EQ(zeCommandListAppendMemoryCopy(list, memory, pageable.data(), 4096, nullptr, 0,
                                          nullptr),
            ZE_RESULT_SUCCESS);

  EXPECT_EQ(zeMemFree(contexts[0], host), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeMemFree(contexts[1], memory), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeCommandListDestroy(list), ZE_RESULT_SUCCESS);
  for (ze_context_handle_t context : contexts) {
    EXPECT_EQ(zeContextDestroy(context), ZE_RESULT_SUCCESS);
  }
}

}  // namespace
}  // namespace devalloc::level_zero_test
