// The host plugin, opened with dlopen and driven through its function table.
#include "opened_plugin.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace devalloc::zoo_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct ReleaseCounter {
  std::atomic<int> calls{0};
  static void on_release(void* self) { ++static_cast<ReleaseCounter*>(self)->calls; }
};

// An on_release that holds the worker until opened, so that later copies
// are certainly still queued.
struct Gate {
  std::mutex mutex;
  std::condition_variable opened_cv;
  bool opened = false;
  static void on_release(void* self) {
    auto* gate = static_cast<Gate*>(self);
    std::unique_lock lock(gate->mutex);
    gate->opened_cv.wait(lock, [&] { return gate->opened; });
  }
  void open() {
    {
      std::lock_guard lock(mutex);
      opened = true;
    }
    opened_cv.notify_all();
  }
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return bytes;
}

std::unique_ptr<Instance> open_host(const Instance::Options& options) {
  devalloc_status status = DEVALLOC_STATUS_OK;
  auto error = empty_error();
  auto instance =
      Instance::open(installed_plugin_file("libdevalloc_host.so"), options, &status, &error);
  EXPECT_EQ(status, DEVALLOC_STATUS_OK) << error.message;
  return instance;
}

const Instance::Options sync_mode{};
const Instance::Options async_mode{{"async", "true"}};

TEST(HostPlugin, GivenAsyncHost_WhenCopyingUntilReleased_ThenSynchronizeLandsBytesAndReleasesEachSourceOnce) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  constexpr size_t chunk = 64 * 1024, chunks = 16;
  const auto expected = pattern(chunk * chunks, 3);
  uint64_t base = 0;
  ASSERT_EQ(host->allocate(expected.size(), 0, &base), DEVALLOC_STATUS_OK) << host->message();
  ReleaseCounter released;
  for (size_t i = 0; i < chunks; ++i) {
    ASSERT_EQ(host->copy(base + i * chunk, expected.data() + i * chunk, chunk,
                         DEVALLOC_SRC_UNTIL_RELEASED, ReleaseCounter::on_release, &released),
              DEVALLOC_STATUS_OK)
        << host->message();
  }
  ASSERT_EQ(host->synchronize(), DEVALLOC_STATUS_OK) << host->message();
  EXPECT_EQ(released.calls, static_cast<int>(chunks));
  std::vector<uint8_t> actual(expected.size());
  ASSERT_EQ(host->read(actual.data(), base, actual.size()), DEVALLOC_STATUS_OK);
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(host->deallocate(base), DEVALLOC_STATUS_OK);
}

TEST(HostPlugin, GivenSyncHost_WhenCopyingUntilReleased_ThenSourceIsReleasedBeforeTheCallReturns) {
  auto host = open_host(sync_mode);
  ASSERT_TRUE(host);
  const auto bytes = pattern(4096, 1);
  uint64_t base = 0;
  ASSERT_EQ(host->allocate(bytes.size(), 0, &base), DEVALLOC_STATUS_OK);
  ReleaseCounter released;
  ASSERT_EQ(host->copy(base, bytes.data(), bytes.size(), DEVALLOC_SRC_UNTIL_RELEASED,
                       ReleaseCounter::on_release, &released),
            DEVALLOC_STATUS_OK);
  EXPECT_EQ(released.calls, 1);
  std::vector<uint8_t> actual(bytes.size());
  ASSERT_EQ(host->read(actual.data(), base, actual.size()), DEVALLOC_STATUS_OK);
  EXPECT_EQ(actual, bytes);
}

TEST(HostPlugin, GivenAsyncHost_WhenSourceIsOverwrittenRightAfterDuringCallCopy_ThenDeviceHoldsTheOldBytes) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  const auto expected = pattern(1 << 20, 5);
  auto src = expected;
  uint64_t base = 0;
  ASSERT_EQ(host->allocate(src.size(), 0, &base), DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->copy(base, src.data(), src.size(), DEVALLOC_SRC_DURING_CALL), DEVALLOC_STATUS_OK);
  std::fill(src.begin(), src.end(), uint8_t{0});
  ASSERT_EQ(host->synchronize(), DEVALLOC_STATUS_OK);
  std::vector<uint8_t> actual(src.size());
  ASSERT_EQ(host->read(actual.data(), base, actual.size()), DEVALLOC_STATUS_OK);
  EXPECT_EQ(actual, expected);
}

TEST(HostPlugin, GivenQueuedCopies_WhenDuringCallCopyAndReadFollow_ThenTheyOrderAfterTheQueue) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  Gate gate;
  const auto first = pattern(256, 1), second = pattern(256, 2);
  uint64_t base = 0;
  ASSERT_EQ(host->allocate(512, 0, &base), DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->copy(base, first.data(), 256, DEVALLOC_SRC_UNTIL_RELEASED, Gate::on_release, &gate),
            DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->copy(base + 256, first.data(), 256, DEVALLOC_SRC_UNTIL_RELEASED),
            DEVALLOC_STATUS_OK);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.open();
  });
  // Overlaps the queued second copy: it must land after it, not before.
  ASSERT_EQ(host->copy(base + 256, second.data(), 256, DEVALLOC_SRC_DURING_CALL), DEVALLOC_STATUS_OK);
  std::vector<uint8_t> actual(512);
  ASSERT_EQ(host->read(actual.data(), base, actual.size()), DEVALLOC_STATUS_OK);
  opener.join();
  EXPECT_TRUE(std::equal(first.begin(), first.end(), actual.begin()));
  EXPECT_TRUE(std::equal(second.begin(), second.end(), actual.begin() + 256));
}

TEST(HostPlugin, GivenCopyOutsideAnyAllocation_ThenInvalidArgumentNamesDstAndNbytesAndSourceIsReleasedOnce) {
  for (const auto& options : {sync_mode, async_mode}) {
    auto host = open_host(options);
    ASSERT_TRUE(host);
    uint64_t base = 0;
    ASSERT_EQ(host->allocate(100, 0, &base), DEVALLOC_STATUS_OK);
    const auto bytes = pattern(101, 0);
    ReleaseCounter released;
    EXPECT_EQ(host->copy(base, bytes.data(), 101, DEVALLOC_SRC_UNTIL_RELEASED,
                         ReleaseCounter::on_release, &released),
              DEVALLOC_STATUS_INVALID_ARGUMENT);
    char dst[32];
    std::snprintf(dst, sizeof dst, "dst = 0x%llx", static_cast<unsigned long long>(base));
    EXPECT_THAT(host->message(), StartsWith("copy_host_to_device(device = 0, "));
    EXPECT_THAT(host->message(), HasSubstr(dst));
    EXPECT_THAT(host->message(), HasSubstr("nbytes = 101"));
    EXPECT_EQ(released.calls, 1);
    ASSERT_EQ(host->synchronize(), DEVALLOC_STATUS_OK);
    EXPECT_EQ(released.calls, 1);
  }
}

TEST(HostPlugin, GivenZeroBytesUntilReleased_ThenSourceIsStillReleasedOnce) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  ReleaseCounter released;
  EXPECT_EQ(host->copy(0, nullptr, 0, DEVALLOC_SRC_UNTIL_RELEASED, ReleaseCounter::on_release,
                       &released),
            DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->synchronize(), DEVALLOC_STATUS_OK);
  EXPECT_EQ(released.calls, 1);
}

// PLUGIN-14 releases a failed until-released copy too, also one refused
// before the plugin looked at its instance: the kit takes the release first.
TEST(HostPlugin, GivenNullInstance_WhenCopyingUntilReleased_ThenInvalidArgumentAndSourceReleasedOnce) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  const uint8_t byte = 1;
  devalloc_copy_to_device_args args{};
  args.struct_size = sizeof args;
  args.dst = 0x1000;
  args.src = &byte;
  args.nbytes = 1;
  args.src_lifetime = DEVALLOC_SRC_UNTIL_RELEASED;
  ReleaseCounter released;
  args.on_release = ReleaseCounter::on_release;
  args.user_data = &released;
  auto error = empty_error();
  EXPECT_EQ(host->api().copy_host_to_device(nullptr, &args, &error),
            DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("instance is NULL"));
  EXPECT_EQ(released.calls, 1);
}

TEST(HostPlugin, GivenImpossibleSize_WhenAllocating_ThenOutOfDeviceMemoryNamesTheCall) {
  auto host = open_host(sync_mode);
  ASSERT_TRUE(host);
  uint64_t address = 1;
  EXPECT_EQ(host->allocate(UINT64_MAX, 0, &address), DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY);
  EXPECT_THAT(host->message(),
              StartsWith("allocate(device = 0, nbytes = 18446744073709551615, alignment = 0): "
                         "out of device memory"));
}

// One byte more than the host has is refused before malloc is asked: with
// overcommit, malloc could hand it out and the load fail only when the
// pages are touched.
TEST(HostPlugin, GivenOneByteMoreThanTheHostHas_WhenAllocating_ThenRefusedNamingTheTotal) {
  auto host = open_host(sync_mode);
  ASSERT_TRUE(host);
  ASSERT_NE(host->api().get_memory_info, nullptr);
  uint64_t free_bytes = 0, total = 0;
  devalloc_error error = empty_error();
  ASSERT_EQ(host->api().get_memory_info(host->get(), 0, &free_bytes, &total, &error),
            DEVALLOC_STATUS_OK);
  uint64_t address = 1;
  EXPECT_EQ(host->allocate(total + 1, 0, &address), DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY);
  EXPECT_THAT(host->message(), HasSubstr("out of device memory (the host has " +
                                         std::to_string(total) + " bytes)"));
}

TEST(HostPlugin, GivenAlignments_WhenAllocating_ThenPowersOfTwoUpToOneMibAreHonoured) {
  auto host = open_host(sync_mode);
  ASSERT_TRUE(host);
  uint64_t address = 0;
  ASSERT_EQ(host->allocate(10, 0, &address), DEVALLOC_STATUS_OK);
  EXPECT_EQ(address % 256, 0u);
  EXPECT_EQ(host->deallocate(address), DEVALLOC_STATUS_OK);
  for (uint64_t alignment : {uint64_t{1}, uint64_t{64}, uint64_t{4096}, uint64_t{1} << 20}) {
    ASSERT_EQ(host->allocate(10, alignment, &address), DEVALLOC_STATUS_OK) << alignment;
    EXPECT_EQ(address % alignment, 0u);
    EXPECT_EQ(host->deallocate(address), DEVALLOC_STATUS_OK);
  }
  EXPECT_EQ(host->allocate(10, 3, &address), DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(host->allocate(10, uint64_t{1} << 21, &address), DEVALLOC_STATUS_UNSUPPORTED);
  ASSERT_EQ(host->allocate(0, 0, &address), DEVALLOC_STATUS_OK);
  EXPECT_EQ(address, 0u);
}

TEST(HostPlugin, GivenUnknownAddress_WhenDeallocating_ThenInvalidArgument) {
  auto host = open_host(sync_mode);
  ASSERT_TRUE(host);
  uint64_t address = 0;
  ASSERT_EQ(host->allocate(64, 0, &address), DEVALLOC_STATUS_OK);
  EXPECT_EQ(host->deallocate(address + 1), DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(host->deallocate(address), DEVALLOC_STATUS_OK);
  EXPECT_EQ(host->deallocate(address), DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(host->message(), HasSubstr("not a live allocation"));
  EXPECT_EQ(host->deallocate(0), DEVALLOC_STATUS_OK);
}

TEST(HostPlugin, GivenOneDevice_ThenItDescribesHostMemory) {
  auto host = open_host(sync_mode);
  ASSERT_TRUE(host);
  auto error = empty_error();
  uint32_t count = 0;
  ASSERT_EQ(host->api().get_device_count(host->get(), &count, &error), DEVALLOC_STATUS_OK);
  EXPECT_EQ(count, 1u);
  devalloc_device_properties properties{};
  properties.struct_size = sizeof properties;
  ASSERT_EQ(host->api().get_device_properties(host->get(), 0, &properties, &error),
            DEVALLOC_STATUS_OK);
  EXPECT_STREQ(properties.name, "host memory");
  EXPECT_EQ(properties.total_memory_bytes,
            static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE)));
  EXPECT_STREQ(properties.pci_bus_id, "");
  EXPECT_EQ(properties.dlpack_device_type, DEVALLOC_DLPACK_CPU);
  EXPECT_EQ(properties.dlpack_device_id, 0);
  for (uint8_t b : properties.uuid) EXPECT_EQ(b, 0);
  EXPECT_EQ(host->api().get_device_properties(host->get(), 1, &properties, &error),
            DEVALLOC_STATUS_NO_SUCH_DEVICE);
  EXPECT_EQ(host->api().synchronize(host->get(), 1, &error), DEVALLOC_STATUS_NO_SUCH_DEVICE);
}

TEST(HostPlugin, GivenAsyncOption_ThenCapabilitiesAdvertiseAsyncCopies) {
  for (const bool async : {false, true}) {
    auto host = open_host(async ? async_mode : sync_mode);
    ASSERT_TRUE(host);
    auto error = empty_error();
    devalloc_capabilities capabilities{};
    capabilities.struct_size = sizeof capabilities;
    ASSERT_EQ(host->api().get_capabilities(host->get(), &capabilities, &error), DEVALLOC_STATUS_OK);
    EXPECT_EQ(capabilities.flags, DEVALLOC_CAPABILITY_HOST_STAGING |
                                      DEVALLOC_CAPABILITY_HOST_ADDRESSABLE |
                                      (async ? DEVALLOC_CAPABILITY_ASYNC_COPY : 0));
    EXPECT_EQ(capabilities.max_alignment, uint64_t{1} << 20);
  }
}

TEST(HostPlugin, GivenBadOptions_WhenCreating_ThenInvalidArgumentNamesTheOption) {
  for (const Instance::Options& options :
       {Instance::Options{{"copy_threads", "2"}}, Instance::Options{{"async", "maybe"}}}) {
    devalloc_status status = DEVALLOC_STATUS_OK;
    auto error = empty_error();
    EXPECT_FALSE(Instance::open(installed_plugin_file("libdevalloc_host.so"), options, &status,
                                &error));
    EXPECT_EQ(status, DEVALLOC_STATUS_INVALID_ARGUMENT);
    EXPECT_THAT(error.message, HasSubstr(options[0].first));
  }
}

TEST(HostPlugin, GivenHostStaging_ThenBuffersArePageAlignedAndTracked) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  auto error = empty_error();
  void* buffer = nullptr;
  ASSERT_EQ(host->api().allocate_host(host->get(), 10000, &buffer, &error), DEVALLOC_STATUS_OK);
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer) % static_cast<uintptr_t>(sysconf(_SC_PAGE_SIZE)), 0u);
  std::memset(buffer, 1, 10000);
  int stack_object = 0;
  EXPECT_EQ(host->api().free_host(host->get(), &stack_object, &error),
            DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(host->api().free_host(host->get(), buffer, &error), DEVALLOC_STATUS_OK);
  EXPECT_EQ(host->api().free_host(host->get(), nullptr, &error), DEVALLOC_STATUS_OK);
  void* empty = &stack_object;
  ASSERT_EQ(host->api().allocate_host(host->get(), 0, &empty, &error), DEVALLOC_STATUS_OK);
  EXPECT_EQ(empty, nullptr);
  // Left live on purpose: destroy() must free it.
  ASSERT_EQ(host->api().allocate_host(host->get(), 100, &buffer, &error), DEVALLOC_STATUS_OK);
}

TEST(HostPlugin, GivenPendingCopies_WhenDestroying_ThenEveryCopyLandsAndIsReleased) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  Gate gate;
  ReleaseCounter released;
  const auto bytes = pattern(4096, 9);
  uint64_t base = 0;
  ASSERT_EQ(host->allocate(bytes.size(), 0, &base), DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->copy(base, bytes.data(), 1, DEVALLOC_SRC_UNTIL_RELEASED, Gate::on_release, &gate),
            DEVALLOC_STATUS_OK);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(host->copy(base, bytes.data(), bytes.size(), DEVALLOC_SRC_UNTIL_RELEASED,
                         ReleaseCounter::on_release, &released),
              DEVALLOC_STATUS_OK);
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.open();
  });
  // The allocation stays live on purpose: destroy() must free it.
  host->destroy();
  opener.join();
  EXPECT_EQ(released.calls, 8);
}

TEST(HostPlugin, GivenAllocationFreedUnderAQueuedCopy_ThenNextSynchronizeReportsDeviceError) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  Gate gate;
  ReleaseCounter released;
  const auto bytes = pattern(64, 2);
  uint64_t held = 0, victim = 0;
  ASSERT_EQ(host->allocate(64, 0, &held), DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->allocate(64, 0, &victim), DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->copy(held, bytes.data(), 64, DEVALLOC_SRC_UNTIL_RELEASED, Gate::on_release, &gate),
            DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->copy(victim, bytes.data(), 64, DEVALLOC_SRC_UNTIL_RELEASED,
                       ReleaseCounter::on_release, &released),
            DEVALLOC_STATUS_OK);
  ASSERT_EQ(host->deallocate(victim), DEVALLOC_STATUS_OK);
  gate.open();
  EXPECT_EQ(host->synchronize(), DEVALLOC_STATUS_DEVICE_ERROR);
  EXPECT_THAT(host->message(), StartsWith("synchronize(device = 0): "));
  EXPECT_THAT(host->message(), HasSubstr("freed"));
  EXPECT_EQ(released.calls, 1);
  EXPECT_EQ(host->synchronize(), DEVALLOC_STATUS_OK);
}

TEST(HostPlugin, GivenThreadsCopyingConcurrently_ThenEveryRegionLands) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  constexpr size_t threads = 4, region = 256 * 1024;
  uint64_t base = 0;
  ASSERT_EQ(host->allocate(threads * region, 0, &base), DEVALLOC_STATUS_OK);
  std::vector<std::vector<uint8_t>> sources;
  for (size_t t = 0; t < threads; ++t) sources.push_back(pattern(region, static_cast<uint8_t>(t)));
  ReleaseCounter released;
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      constexpr size_t piece = 4096;
      for (size_t off = 0; off < region; off += piece) {
        const auto lifetime = (off / piece) % 2 ? DEVALLOC_SRC_DURING_CALL : DEVALLOC_SRC_UNTIL_RELEASED;
        if (host->copy(base + t * region + off, sources[t].data() + off, piece, lifetime,
                       ReleaseCounter::on_release, &released) != DEVALLOC_STATUS_OK) {
          ++failures;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  ASSERT_EQ(host->synchronize(), DEVALLOC_STATUS_OK);
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(released.calls, static_cast<int>(threads * region / 4096 / 2));
  std::vector<uint8_t> actual(region);
  for (size_t t = 0; t < threads; ++t) {
    ASSERT_EQ(host->read(actual.data(), base + t * region, region), DEVALLOC_STATUS_OK);
    EXPECT_EQ(actual, sources[t]) << "region " << t;
  }
}

TEST(HostPlugin, GivenMalformedArguments_ThenInvalidArgumentWithoutACrash) {
  auto host = open_host(async_mode);
  ASSERT_TRUE(host);
  auto error = empty_error();
  EXPECT_EQ(host->api().allocate(host->get(), nullptr, &error), DEVALLOC_STATUS_INVALID_ARGUMENT);
  devalloc_allocate_args small{};
  small.struct_size = 8;
  EXPECT_EQ(host->api().allocate(host->get(), &small, &error), DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(host->api().allocate(nullptr, &small, nullptr), DEVALLOC_STATUS_INVALID_ARGUMENT);
  uint64_t base = 0;
  ASSERT_EQ(host->allocate(16, 0, &base), DEVALLOC_STATUS_OK);
  EXPECT_EQ(host->copy(base, nullptr, 16, DEVALLOC_SRC_DURING_CALL), DEVALLOC_STATUS_INVALID_ARGUMENT);
  const uint8_t byte = 0;
  EXPECT_EQ(host->copy(base, &byte, 1, 7), DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(host->message(), HasSubstr("src_lifetime"));
  EXPECT_EQ(host->read(nullptr, base, 16), DEVALLOC_STATUS_INVALID_ARGUMENT);
  uint8_t out[32];
  EXPECT_EQ(host->read(out, base, 32), DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(host->api().get_device_count(host->get(), nullptr, &error),
            DEVALLOC_STATUS_INVALID_ARGUMENT);
}

TEST(HostPlugin, GivenStagingBeyondTheHost_WhenAllocatingHostMemory_ThenOutOfHostMemory) {
  auto host = open_host(sync_mode);
  ASSERT_TRUE(host);
  devalloc_error error = empty_error();
  void* buffer = &error;
  EXPECT_EQ(host->api().allocate_host(host->get(), UINT64_MAX, &buffer, &error),
            DEVALLOC_STATUS_OUT_OF_HOST_MEMORY);
  EXPECT_EQ(buffer, nullptr);
  EXPECT_THAT(std::string(error.message), HasSubstr("out of host memory"));
}

}  // namespace
}  // namespace devalloc::zoo_test
