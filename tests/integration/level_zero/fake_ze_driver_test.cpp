// The fake driver catches what a Level Zero user could get wrong and still
// pass on real hardware by luck: planted misuse, through Debian's loader,
// each recorded as a violation.
#include "level_zero_fixture.hpp"

#include <level_zero/ze_api.h>

#include <thread>

namespace devalloc::level_zero_test {
namespace {

// zeInit, the fake's driver, its first device and a context, an immediate
// list and a host-visible event pool with two events.
class FakeZeMisuse : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(zeInit(0), ZE_RESULT_SUCCESS);
    uint32_t count = 1;
    ASSERT_EQ(zeDriverGet(&count, &driver_), ZE_RESULT_SUCCESS);
    count = 1;
    ASSERT_EQ(zeDeviceGet(driver_, &count, &device_), ZE_RESULT_SUCCESS);
    fake_ = std::make_unique<FakeZe>();
    ASSERT_TRUE(fake_->loaded());
    fake_->reset();
    ze_context_desc_t context = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
    ASSERT_EQ(zeContextCreate(driver_, &context, &context_), ZE_RESULT_SUCCESS);
    ze_command_queue_desc_t queue = {};
    queue.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
    queue.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
    ASSERT_EQ(zeCommandListCreateImmediate(context_, device_, &queue, &list_),
              ZE_RESULT_SUCCESS);
    ze_event_pool_desc_t pool = {};
    pool.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
    pool.flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
    pool.count = 2;
    ASSERT_EQ(zeEventPoolCreate(context_, &pool, 1, &device_, &pool_),
              ZE_RESULT_SUCCESS);
    for (uint32_t i = 0; i < 2; ++i) {
      ze_event_desc_t event = {};
      event.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
      event.index = i;
      ASSERT_EQ(zeEventCreate(pool_, &event, &events_[i]), ZE_RESULT_SUCCESS);
    }
    ze_device_mem_alloc_desc_t desc = {};
    desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
    ASSERT_EQ(zeMemAllocDevice(context_, &desc, kBytes, 0, device_, &memory_),
              ZE_RESULT_SUCCESS);
  }
  void TearDown() override {
    if (!fake_ || context_ == nullptr) return;  // SetUp failed
    fake_->pause(false);
    for (ze_event_handle_t e : events_) {
      if (e != nullptr) {
        zeEventHostSynchronize(e, 0);
        zeEventDestroy(e);
      }
    }
    zeEventPoolDestroy(pool_);
    zeCommandListDestroy(list_);
    if (memory_ != nullptr) zeMemFree(context_, memory_);
    zeContextDestroy(context_);
    EXPECT_EQ(fake_->violations(), "");
  }

  // Expects exactly one recorded violation containing `text`, then forgets it.
  void expect_violation(const std::string& text) {
    const std::string violations = fake_->violations();
    EXPECT_NE(violations.find(text), std::string::npos) << violations;
    fake_->reset();
  }

  static constexpr size_t kBytes = 4096;
  ze_driver_handle_t driver_ = nullptr;
  ze_device_handle_t device_ = nullptr;
  ze_context_handle_t context_ = nullptr;
  ze_command_list_handle_t list_ = nullptr;
  ze_event_pool_handle_t pool_ = nullptr;
  ze_event_handle_t events_[2] = {};
  void* memory_ = nullptr;
  std::vector<uint8_t> host_ = std::vector<uint8_t>(kBytes, 1);
  std::unique_ptr<FakeZe> fake_;
};

TEST_F(FakeZeMisuse, OneCommandListFromTwoThreadsAtOnce_Recorded) {
  auto append = [this] {
    for (int i = 0; i < 200; ++i) {
      zeCommandListAppendMemoryCopy(list_, memory_, host_.data(), 64, nullptr,
                                    0, nullptr);
    }
  };
  std::thread a(append), b(append);
  a.join();
  b.join();
  ASSERT_EQ(zeCommandListAppendBarrier(list_, events_[0], 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(events_[0], UINT64_MAX), ZE_RESULT_SUCCESS);
  expect_violation("used from two threads at once");
}

TEST_F(FakeZeMisuse, EventSignaledAgainWithoutReset_Recorded) {
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list_, memory_, host_.data(), 64,
                                          events_[0], 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(events_[0], UINT64_MAX), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list_, memory_, host_.data(), 64,
                                          events_[0], 0, nullptr),
            ZE_RESULT_SUCCESS);
  // The event reads as signaled at once; a barrier shows when the copy ran.
  ASSERT_EQ(zeCommandListAppendBarrier(list_, events_[1], 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(events_[1], UINT64_MAX), ZE_RESULT_SUCCESS);
  expect_violation("must be reset with zeEventHostReset");
}

TEST_F(FakeZeMisuse, EventCompletesLate_QueryStatusNotReadyUntilTheListRan) {
  fake_->pause(true);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list_, memory_, host_.data(), 64,
                                          events_[0], 0, nullptr),
            ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventQueryStatus(events_[0]), ZE_RESULT_NOT_READY);
  EXPECT_EQ(zeEventHostSynchronize(events_[0], 1000), ZE_RESULT_NOT_READY);
  fake_->pause(false);
  EXPECT_EQ(zeEventHostSynchronize(events_[0], UINT64_MAX), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventQueryStatus(events_[0]), ZE_RESULT_SUCCESS);
}

TEST_F(FakeZeMisuse, DeviceMemoryFreedWhileACopyStillWritesIt_Recorded) {
  fake_->pause(true);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list_, memory_, host_.data(), 64,
                                          events_[0], 0, nullptr),
            ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeMemFree(context_, memory_), ZE_RESULT_SUCCESS);
  memory_ = nullptr;
  fake_->pause(false);
  // The copy does not run into freed memory; as on a device that faults,
  // its event reports the device lost.
  EXPECT_EQ(zeEventHostSynchronize(events_[0], UINT64_MAX),
            ZE_RESULT_ERROR_DEVICE_LOST);
  expect_violation("was freed before the copy that uses it ran");
}

// zeCommandListAppendMemoryCopy: "the memory was allocated ... on the same
// context" as the list. A driver may reject it, or fault.
TEST_F(FakeZeMisuse, HostMemoryOfAnotherContext_RefusedAndRecorded) {
  ze_context_desc_t desc = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
  ze_context_handle_t other = nullptr;
  ASSERT_EQ(zeContextCreate(driver_, &desc, &other), ZE_RESULT_SUCCESS);
  ze_host_mem_alloc_desc_t host_desc = {};
  host_desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  void* host = nullptr;
  ASSERT_EQ(zeMemAllocHost(other, &host_desc, kBytes, 0, &host), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeCommandListAppendMemoryCopy(list_, memory_, static_cast<char*>(host) + 64, 64,
                                          nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  expect_violation("was allocated (zeMemAllocHost) on context");
  EXPECT_EQ(zeCommandListAppendMemoryCopy(list_, host, memory_, 64, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT)
      << "as the destination too";
  expect_violation("not on the command list's context");
  EXPECT_EQ(zeMemFree(other, host), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeContextDestroy(other), ZE_RESULT_SUCCESS);
}

TEST_F(FakeZeMisuse, CopyPastTheEndOfAnAllocation_RefusedAndRecorded) {
  EXPECT_EQ(zeCommandListAppendMemoryCopy(list_,
                                          static_cast<char*>(memory_) + 64,
                                          host_.data(), kBytes, nullptr, 0,
                                          nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  expect_violation("outside every live allocation");
}

TEST_F(FakeZeMisuse, DeviceMemoryFreedTwice_Recorded) {
  ASSERT_EQ(zeMemFree(context_, memory_), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeMemFree(context_, memory_), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  memory_ = nullptr;
  expect_violation("double free");
}

TEST_F(FakeZeMisuse, MemoryLimitOfTheDevice_OutOfDeviceMemory) {
  ze_relaxed_allocation_limits_exp_desc_t relaxed = {};
  relaxed.stype = ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC;
  relaxed.flags = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE;
  ze_device_mem_alloc_desc_t desc = {};
  desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  desc.pNext = &relaxed;
  void* p = nullptr;
  EXPECT_EQ(zeMemAllocDevice(context_, &desc, size_t{1} << 30, 0, device_, &p),
            ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
}

// As the specification says (and Intel's driver does): a size of
// maxMemAllocSize or more needs relaxed allocation limits.
TEST_F(FakeZeMisuse, SizeFromMaxMemAllocSizeOn_UnsupportedUnlessRelaxedLimitsAreChained) {
  ze_device_properties_t properties = {};
  properties.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
  ASSERT_EQ(zeDeviceGetProperties(device_, &properties), ZE_RESULT_SUCCESS);
  const size_t max = properties.maxMemAllocSize;
  EXPECT_EQ(max, size_t{1} << 28) << "a quarter of the device's memory";
  ze_device_mem_alloc_desc_t desc = {};
  desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  ze_host_mem_alloc_desc_t host_desc = {};
  host_desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  void* p = nullptr;
  EXPECT_EQ(zeMemAllocDevice(context_, &desc, max, 0, device_, &p),
            ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  EXPECT_EQ(zeMemAllocHost(context_, &host_desc, max, 0, &p), ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  ze_relaxed_allocation_limits_exp_desc_t relaxed = {};
  relaxed.stype = ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC;
  relaxed.flags = 0;
  desc.pNext = &relaxed;
  EXPECT_EQ(zeMemAllocDevice(context_, &desc, max, 0, device_, &p),
            ZE_RESULT_ERROR_UNSUPPORTED_SIZE)
      << "relaxed limits without the MAX_SIZE flag";
  relaxed.flags = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE;
  ASSERT_EQ(zeMemAllocDevice(context_, &desc, max, 0, device_, &p), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeMemFree(context_, p), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeMemAllocDevice(context_, &desc, max - 1, 0, device_, &p), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeMemFree(context_, p), ZE_RESULT_SUCCESS);
}

}  // namespace
}  // namespace devalloc::level_zero_test
