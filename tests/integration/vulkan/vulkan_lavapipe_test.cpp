// The Vulkan plugin on a real driver: Mesa's lavapipe (llvmpipe), a Vulkan
// 1.3 driver that runs on the CPU, pinned by the test's environment
// (VK_DRIVER_FILES), through Debian's real Vulkan loader. What the plugin
// reports, copies read back, releases that fire with no synchronize,
// mapping, addresses across instances, the runtime missing, and the cache
// of freed buffers.
#include <devalloc/plugin_loader.hpp>
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "vk_counting_loader.h"

namespace devalloc::vulkan_test {
namespace {

const std::string kPlugin = DEVALLOC_VULKAN_PLUGIN;
constexpr uint32_t kDevice = 0;

std::vector<uint8_t> pattern(size_t nbytes, int seed) {
  std::vector<uint8_t> bytes(nbytes);
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed) * 7919u;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return bytes;
}

struct ReleaseCounter {
  std::atomic<int> releases{0};
  static void on_release(void* self) { static_cast<ReleaseCounter*>(self)->releases.fetch_add(1); }
};

// Polls (at most a minute, so that a plugin that never releases fails
// instead of hanging) until `count` releases came.
bool wait_for_releases(const ReleaseCounter& counter, int count) {
  for (int i = 0; i < 60000 && counter.releases.load() < count; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return counter.releases.load() >= count;
}

std::shared_ptr<Plugin> load(const PluginOptions& options = {}) {
  auto [plugin, error] = PluginLoader().load(kPlugin, options);
  EXPECT_TRUE(plugin) << error.status.message();
  return plugin;
}

class VulkanLavapipe : public ::testing::Test {
 protected:
  void SetUp() override {
    plugin_ = load();
    ASSERT_TRUE(plugin_);
    ASSERT_FALSE(plugin_->devices().empty()) << "lavapipe offers no device";
  }
  Plugin& plugin() { return *plugin_; }

  uint64_t allocate(uint64_t nbytes, uint64_t alignment = 0) {
    Result<uint64_t> address = plugin().allocate(kDevice, nbytes, alignment);
    EXPECT_TRUE(address.ok()) << address.status().message();
    return address.ok() ? *address : 0;
  }
  std::vector<uint8_t> read(uint64_t address, size_t nbytes) {
    std::vector<uint8_t> bytes(nbytes);
    const Status s = plugin().copy_to_host(kDevice, bytes.data(), address, nbytes);
    EXPECT_TRUE(s.ok()) << s.message();
    return bytes;
  }

 private:
  std::shared_ptr<Plugin> plugin_;
};

TEST_F(VulkanLavapipe, GivenLavapipe_WhenListed_ThenItIsLlvmpipeWithVulkanDlpackTypeAndAllCapabilities) {
  const DeviceInfo& device = plugin().devices().at(kDevice);
  EXPECT_NE(device.name.find("llvmpipe"), std::string::npos) << device.name;
  EXPECT_EQ(device.dlpack_device_type, DEVALLOC_DLPACK_VULKAN);
  EXPECT_EQ(device.dlpack_device_id, 0);
  EXPECT_GT(device.total_memory_bytes, 0u);
  EXPECT_TRUE(device.has_uuid()) << "VkPhysicalDeviceIDProperties::deviceUUID";
  // lavapipe offers no VK_EXT_pci_bus_info: no bus id.
  EXPECT_EQ(device.pci_bus_id, "");
  const Capabilities& c = plugin().capabilities();
  EXPECT_TRUE(c.async_copy);
  EXPECT_TRUE(c.host_staging);
  EXPECT_TRUE(c.host_mappable) << "lavapipe's one memory type is HOST_VISIBLE";
  EXPECT_FALSE(c.host_addressable);
  EXPECT_EQ(c.max_alignment, uint64_t{2} << 20);
}

TEST_F(VulkanLavapipe, GivenNoMemoryBudgetExtension_WhenAllocating_ThenFreeMemoryIsTotalLessThisInstance) {
  constexpr uint64_t kBytes = uint64_t{3} << 20;
  const uint64_t total = plugin().devices()[kDevice].total_memory_bytes;
  const uint64_t address = allocate(kBytes);
  const auto info = plugin().memory_info(kDevice);
  ASSERT_TRUE(info.ok()) << info.status().message();
  ASSERT_TRUE((*info).has_value());
  EXPECT_EQ((*info)->total_bytes, total);
  EXPECT_EQ((*info)->free_bytes, total - kBytes);
  EXPECT_TRUE(plugin().deallocate(kDevice, address).ok());
}

TEST_F(VulkanLavapipe, GivenAlignments_WhenAllocating_ThenEachAddressHonoursItsAlignment) {
  for (uint64_t alignment : {uint64_t{256}, uint64_t{4096}, uint64_t{1} << 16, uint64_t{2} << 20}) {
    const uint64_t address = allocate(1000, alignment);
    EXPECT_EQ(address % alignment, 0u) << "alignment " << alignment;
    // The last byte is a valid destination.
    const uint8_t byte = 0x5a;
    EXPECT_TRUE(plugin().copy_to_device(kDevice, address + 999, &byte, 1).ok());
    EXPECT_EQ(read(address + 999, 1)[0], byte);
    EXPECT_TRUE(plugin().deallocate(kDevice, address).ok());
  }
}

// Sizes around the bounce chunk (4 MiB) and offsets that are not aligned.
struct CopyCase {
  size_t nbytes;
  uint64_t offset;
};
const CopyCase kCases[] = {{1, 0},       {255, 1},       {4099, 4093},
                           {65536, 17},  {(4u << 20) + 17, 3}, {(9u << 20) + 1, 4096}};

TEST_F(VulkanLavapipe, GivenVariousSizesAndOffsets_WhenCopiedDuringCall_ThenTheyReadBackEqual) {
  int seed = 0;
  for (const CopyCase& c : kCases) {
    const uint64_t base = allocate(c.offset + c.nbytes);
    std::vector<uint8_t> src = pattern(c.nbytes, ++seed);
    ASSERT_TRUE(plugin().copy_to_device(kDevice, base + c.offset, src.data(), c.nbytes).ok());
    // The source is the caller's again: overwriting it changes nothing.
    std::fill(src.begin(), src.end(), 0);
    EXPECT_EQ(read(base + c.offset, c.nbytes), pattern(c.nbytes, seed)) << c.nbytes << " bytes";
    EXPECT_TRUE(plugin().deallocate(kDevice, base).ok());
  }
}

TEST_F(VulkanLavapipe, GivenPlainHostSources_WhenCopiedUntilReleased_ThenReleasedOnReturnAndReadBackEqual) {
  int seed = 100;
  for (const CopyCase& c : kCases) {
    const uint64_t base = allocate(c.offset + c.nbytes);
    std::vector<uint8_t> src = pattern(c.nbytes, ++seed);
    ReleaseCounter counter;
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(kDevice, base + c.offset, src.data(),
                                                   c.nbytes, ReleaseCounter::on_release,
                                                   &counter)
                    .ok());
    // Bounced through the plugin's chunks: the memcpy was the read.
    EXPECT_EQ(counter.releases.load(), 1);
    std::fill(src.begin(), src.end(), 0);
    ASSERT_TRUE(plugin().synchronize(kDevice).ok());
    EXPECT_EQ(read(base + c.offset, c.nbytes), pattern(c.nbytes, seed)) << c.nbytes << " bytes";
    EXPECT_TRUE(plugin().deallocate(kDevice, base).ok());
  }
}

TEST_F(VulkanLavapipe, GivenStagingSources_WhenCopiedUntilReleased_ThenReleasedBeforeAnySynchronize) {
  constexpr int kCopies = 24;
  constexpr size_t kChunk = 256 * 1024 + 5;
  Result<void*> staging = plugin().allocate_host(kCopies * kChunk);
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  auto* host = static_cast<uint8_t*>(*staging);
  const uint64_t base = allocate(kCopies * kChunk);
  ReleaseCounter counter;
  for (int i = 0; i < kCopies; ++i) {
    const std::vector<uint8_t> bytes = pattern(kChunk, i);
    std::memcpy(host + i * kChunk, bytes.data(), kChunk);
    ASSERT_TRUE(plugin()
                    .copy_to_device_until_released(kDevice, base + i * kChunk, host + i * kChunk,
                                                   kChunk, ReleaseCounter::on_release, &counter)
                    .ok());
  }
  // The timeline's worker fires them as the copies end: no call needed.
  ASSERT_TRUE(wait_for_releases(counter, kCopies)) << counter.releases.load() << " released";
  EXPECT_EQ(counter.releases.load(), kCopies);
  // Released means read: the staging memory is the caller's again.
  std::memset(host, 0, kCopies * kChunk);
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_EQ(read(base + i * kChunk, kChunk), pattern(kChunk, i)) << "copy " << i;
  }
  EXPECT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_TRUE(plugin().free_host(host).ok());
}

TEST_F(VulkanLavapipe, GivenAMappedRange_WhenWrittenAndUnmapped_ThenCopyToHostSeesTheWrites) {
  constexpr size_t kBytes = 1 << 20;
  const uint64_t base = allocate(kBytes);
  constexpr uint64_t kOffset = 4097;
  constexpr size_t kMapped = 70000;
  Result<void*> mapped = plugin().map_to_host(kDevice, base + kOffset, kMapped);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  const std::vector<uint8_t> bytes = pattern(kMapped, 7);
  std::memcpy(*mapped, bytes.data(), kMapped);
  ASSERT_TRUE(plugin().unmap_from_host(kDevice, *mapped).ok());
  EXPECT_EQ(read(base + kOffset, kMapped), bytes);
  EXPECT_TRUE(plugin().deallocate(kDevice, base).ok());
}

TEST_F(VulkanLavapipe, GivenACopiedRange_WhenMapped_ThenTheHostReadsTheCopiedBytes) {
  constexpr size_t kBytes = 8192;
  const uint64_t base = allocate(kBytes);
  const std::vector<uint8_t> bytes = pattern(kBytes, 9);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, base, bytes.data(), kBytes).ok());
  Result<void*> mapped = plugin().map_to_host(kDevice, base, kBytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  EXPECT_EQ(std::memcmp(*mapped, bytes.data(), kBytes), 0);
  EXPECT_TRUE(plugin().unmap_from_host(kDevice, *mapped).ok());
  EXPECT_TRUE(plugin().deallocate(kDevice, base).ok());
}

// Straight through the plugin's table, so that the plugin's own check is
// what answers (not the loader's).
TEST_F(VulkanLavapipe, GivenARangeBeyondAnAllocation_WhenMapped_ThenThePluginRefusesItNamingPlugin22) {
  constexpr size_t kBytes = 4096;
  const uint64_t base = allocate(kBytes);
  const devalloc_plugin_api_v1& api = plugin().api();
  devalloc_map_args args = {};
  args.struct_size = sizeof args;
  args.device = kDevice;
  args.address = base + kBytes - 16;
  args.nbytes = 17;
  devalloc_error error = {};
  error.struct_size = sizeof error;
  EXPECT_EQ(api.map_to_host(plugin().instance(), &args, &error), DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error.message).find("PLUGIN-22"), std::string::npos) << error.message;
  EXPECT_EQ(args.host, nullptr);

  int not_mapped = 0;
  error = {};
  error.struct_size = sizeof error;
  EXPECT_EQ(api.unmap_from_host(plugin().instance(), kDevice, &not_mapped, &error),
            DEVALLOC_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error.message).find("PLUGIN-22"), std::string::npos) << error.message;
  EXPECT_TRUE(plugin().deallocate(kDevice, base).ok());
}

TEST_F(VulkanLavapipe, GivenACopyOutsideAllAllocations_WhenIssued_ThenRefusedNamingTheRange) {
  const uint64_t base = allocate(4096);
  const uint8_t byte = 1;
  const Status s = plugin().copy_to_device(kDevice, base + 4096, &byte, 1);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("PLUGIN-15"), std::string::npos) << s.message();
  EXPECT_TRUE(plugin().deallocate(kDevice, base).ok());
}

void expect_disjoint_across_two_instances(const PluginOptions& options) {
  auto first = load(options);
  auto second = load(options);
  ASSERT_TRUE(first && second);
  constexpr uint64_t kBytes = 1 << 20;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (int i = 0; i < 8; ++i) {
    for (Plugin* p : {first.get(), second.get()}) {
      Result<uint64_t> a = p->allocate(kDevice, kBytes, 0);
      ASSERT_TRUE(a.ok()) << a.status().message();
      ranges.emplace_back(*a, *a + kBytes);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "two live allocations overlap";
  }
}

TEST(VulkanLavapipeInstances, GivenTwoInstances_WhenBothAllocate_ThenNoTwoAddressesOverlap) {
  expect_disjoint_across_two_instances({});
}

TEST(VulkanLavapipeInstances, GivenTheWindowAddressModel_WhenTwoInstancesAllocate_ThenNoTwoAddressesOverlap) {
  expect_disjoint_across_two_instances({{"address_model", "window"}});
}

TEST(VulkanLavapipeInstances, GivenTheWindowAddressModel_WhenCopyingAtOffsets_ThenTheBytesReadBack) {
  auto plugin = load({{"address_model", "window"}});
  ASSERT_TRUE(plugin);
  Result<uint64_t> base = plugin->allocate(kDevice, 100000, 1 << 16);
  ASSERT_TRUE(base.ok()) << base.status().message();
  EXPECT_EQ(*base % (1 << 16), 0u);
  const std::vector<uint8_t> bytes = pattern(5000, 3);
  ASSERT_TRUE(plugin->copy_to_device(kDevice, *base + 90000, bytes.data(), bytes.size()).ok());
  std::vector<uint8_t> back(bytes.size());
  ASSERT_TRUE(plugin->copy_to_host(kDevice, back.data(), *base + 90000, back.size()).ok());
  EXPECT_EQ(back, bytes);
}

TEST(VulkanLavapipeInstances, GivenAnUnknownAddressModel_WhenCreated_ThenRefusedNamingBothModels) {
  auto [plugin, error] = PluginLoader().load(kPlugin, {{"address_model", "virtual"}});
  ASSERT_FALSE(plugin);
  EXPECT_EQ(error.status.code(), StatusCode::invalid_argument);
  EXPECT_NE(error.status.message().find("\"virtual\" is neither \"buffer_device_address\" nor "
                                        "\"window\""),
            std::string::npos)
      << error.status.message();
}

TEST(VulkanLavapipeInstances, GivenAMissingLoaderLibrary_WhenCreated_ThenRuntimeUnavailableNamingThePath) {
  auto [plugin, error] = PluginLoader().load(kPlugin, {{"runtime_library", "/nonexistent"}});
  ASSERT_FALSE(plugin);
  EXPECT_EQ(error.status.code(), StatusCode::runtime_unavailable) << error.status.message();
  EXPECT_NE(error.status.message().find("/nonexistent"), std::string::npos)
      << error.status.message();
}

// Several threads copying to one device at once (the queue and the command
// buffers are shared): every byte lands, every release fires once.
TEST_F(VulkanLavapipe, GivenFourThreadsCopyingToOneDevice_WhenSynchronized_ThenEveryByteLandsAndEveryReleaseFired) {
  constexpr int kThreads = 4;
  constexpr int kCopiesEach = 16;
  constexpr size_t kChunk = 40000;
  const uint64_t base = allocate(kThreads * kCopiesEach * kChunk);
  Result<void*> staging = plugin().allocate_host(kThreads * kCopiesEach * kChunk);
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  auto* host = static_cast<uint8_t*>(*staging);
  ReleaseCounter counter;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCopiesEach; ++i) {
        const int n = t * kCopiesEach + i;
        const std::vector<uint8_t> bytes = pattern(kChunk, n);
        const uint64_t dst = base + n * kChunk;
        Status s;
        if (i % 3 == 0) {
          s = plugin().copy_to_device(kDevice, dst, bytes.data(), kChunk);
        } else if (i % 3 == 1) {
          // Bounced: released before the call returns.
          s = plugin().copy_to_device_until_released(kDevice, dst, bytes.data(), kChunk,
                                                     ReleaseCounter::on_release, &counter);
        } else {
          std::memcpy(host + n * kChunk, bytes.data(), kChunk);
          s = plugin().copy_to_device_until_released(kDevice, dst, host + n * kChunk, kChunk,
                                                     ReleaseCounter::on_release, &counter);
        }
        if (!s.ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  int until_released = 0;
  for (int i = 0; i < kCopiesEach; ++i) until_released += (i % 3 != 0) ? 1 : 0;
  EXPECT_EQ(counter.releases.load(), kThreads * until_released);
  for (int n = 0; n < kThreads * kCopiesEach; ++n) {
    EXPECT_EQ(read(base + n * kChunk, kChunk), pattern(kChunk, n)) << "copy " << n;
  }
  EXPECT_TRUE(plugin().free_host(host).ok());
}

// ---- The cache of freed buffers (plugins/vulkan/vk_buffer_cache.hpp), seen
// through a loader that counts the driver's device memory on its way to
// lavapipe (vk_counting_loader.cpp).

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The counting loader, opened as the plugin opens it (one copy per process).
class CountingLoader {
 public:
  CountingLoader() : library_(dlopen(DEVALLOC_VK_COUNTING_LOADER, RTLD_NOW | RTLD_LOCAL)) {
    if (library_ == nullptr) return;
    read_ = reinterpret_cast<devalloc_test_vk_read_memory_fn>(
        dlsym(library_, "devalloc_test_vk_read_memory"));
    limit_ = reinterpret_cast<devalloc_test_vk_limit_memory_fn>(
        dlsym(library_, "devalloc_test_vk_limit_memory"));
    offer_budget_ = reinterpret_cast<devalloc_test_vk_offer_budget_fn>(
        dlsym(library_, "devalloc_test_vk_offer_budget"));
  }
  ~CountingLoader() {
    if (!ok()) return;
    limit(UINT64_MAX);
    offer_budget(false);
    dlclose(library_);
  }
  CountingLoader(const CountingLoader&) = delete;
  CountingLoader& operator=(const CountingLoader&) = delete;

  bool ok() const { return read_ && limit_ && offer_budget_; }
  devalloc_test_vk_memory read() const {
    devalloc_test_vk_memory m = {};
    read_(&m);
    return m;
  }
  void limit(uint64_t live_bytes) const { limit_(live_bytes); }
  void offer_budget(bool offer) const { offer_budget_(offer ? 1 : 0); }

 private:
  void* library_;
  devalloc_test_vk_read_memory_fn read_ = nullptr;
  devalloc_test_vk_limit_memory_fn limit_ = nullptr;
  devalloc_test_vk_offer_budget_fn offer_budget_ = nullptr;
};

class VulkanLavapipeCache : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(loader_.ok()) << DEVALLOC_VK_COUNTING_LOADER << ": " << dlerror();
    start_ = loader_.read();
  }
  std::shared_ptr<Plugin> load_counted(PluginOptions options = {}) {
    options.emplace_back("runtime_library", DEVALLOC_VK_COUNTING_LOADER);
    return load(options);
  }
  static uint64_t allocate_on(Plugin& plugin, uint64_t nbytes) {
    Result<uint64_t> address = plugin.allocate(kDevice, nbytes, 0);
    EXPECT_TRUE(address.ok()) << address.status().message();
    return address.ok() ? *address : 0;
  }
  // VkDeviceMemory objects and vkAllocateMemory calls since the test began.
  uint64_t live() const { return loader_.read().live_count - start_.live_count; }
  uint64_t allocations() const { return loader_.read().allocations - start_.allocations; }

  CountingLoader loader_;
  devalloc_test_vk_memory start_ = {};
};

TEST_F(VulkanLavapipeCache, GivenAFreedAllocation_WhenAboutItsSizeIsAllocated_ThenItsBufferIsReusedWithoutVkAllocateMemory) {
  for (const char* model : {"buffer_device_address", "window"}) {
    SCOPED_TRACE(model);
    start_ = loader_.read();
    auto plugin = load_counted({{"address_model", model}});
    ASSERT_TRUE(plugin);
    const uint64_t first = allocate_on(*plugin, 3 * kMiB);
    ASSERT_TRUE(plugin->deallocate(kDevice, first).ok());
    EXPECT_EQ(live(), 1u) << "kept, not given back to the driver";
    // 4 KiB less still fills the buffer but for an eighth.
    const uint64_t again = allocate_on(*plugin, 3 * kMiB - 4096);
    EXPECT_EQ(again, first) << "the same buffer, at the same address";
    EXPECT_EQ(allocations(), 1u);
    const std::vector<uint8_t> bytes = pattern(3 * kMiB - 4096, 21);
    ASSERT_TRUE(plugin->copy_to_device(kDevice, again, bytes.data(), bytes.size()).ok());
    std::vector<uint8_t> back(bytes.size());
    ASSERT_TRUE(plugin->copy_to_host(kDevice, back.data(), again, back.size()).ok());
    EXPECT_EQ(back, bytes);
    EXPECT_TRUE(plugin->deallocate(kDevice, again).ok());
  }
}

TEST_F(VulkanLavapipeCache, GivenACachedBuffer_WhenAFarSmallerSizeIsAllocated_ThenANewBufferIsMade) {
  auto plugin = load_counted();
  ASSERT_TRUE(plugin);
  const uint64_t large = allocate_on(*plugin, 4 * kMiB);
  ASSERT_TRUE(plugin->deallocate(kDevice, large).ok());
  const uint64_t small = allocate_on(*plugin, 1 * kMiB);
  EXPECT_EQ(allocations(), 2u) << "1 MiB would leave 3/4 of the cached 4 MiB unused";
  EXPECT_EQ(live(), 2u);
  EXPECT_TRUE(plugin->deallocate(kDevice, small).ok());
}

TEST_F(VulkanLavapipeCache, GivenCacheBytes_WhenMoreIsFreed_ThenTheMostRecentlyFreedAreKeptWithinTheBound) {
  auto plugin = load_counted({{"cache_bytes", std::to_string(5 * kMiB)}});
  ASSERT_TRUE(plugin);
  std::vector<uint64_t> addresses;
  for (int i = 0; i < 4; ++i) addresses.push_back(allocate_on(*plugin, 2 * kMiB));
  for (uint64_t a : addresses) ASSERT_TRUE(plugin->deallocate(kDevice, a).ok());
  // Two buffers of 2 MiB and a few bytes fit in 5 MiB; three do not.
  EXPECT_EQ(live(), 2u);
  EXPECT_LE(loader_.read().live_bytes - start_.live_bytes, 5 * kMiB);
  std::vector<uint64_t> again;
  for (int i = 0; i < 3; ++i) again.push_back(allocate_on(*plugin, 2 * kMiB));
  EXPECT_EQ(allocations(), 5u) << "two from the cache, one new";
  std::sort(again.begin(), again.begin() + 2);
  std::vector<uint64_t> last_two = {addresses[2], addresses[3]};
  std::sort(last_two.begin(), last_two.end());
  EXPECT_EQ(std::vector<uint64_t>(again.begin(), again.begin() + 2), last_two);
  for (uint64_t a : again) EXPECT_TRUE(plugin->deallocate(kDevice, a).ok());
}

TEST_F(VulkanLavapipeCache, GivenCacheBytesZero_WhenAnAllocationIsFreed_ThenItsMemoryIsGivenBack) {
  auto plugin = load_counted({{"cache_bytes", "0"}});
  ASSERT_TRUE(plugin);
  const uint64_t address = allocate_on(*plugin, 1 * kMiB);
  ASSERT_TRUE(plugin->deallocate(kDevice, address).ok());
  EXPECT_EQ(live(), 0u);
}

TEST_F(VulkanLavapipeCache, GivenCachedBuffers_WhenThePluginIsDestroyed_ThenEveryDeviceMemoryIsFreed) {
  auto plugin = load_counted();
  ASSERT_TRUE(plugin);
  std::vector<uint64_t> addresses;
  for (uint64_t mib : {1, 2, 3}) addresses.push_back(allocate_on(*plugin, mib * kMiB));
  ASSERT_TRUE(plugin->deallocate(kDevice, addresses[0]).ok());
  ASSERT_TRUE(plugin->deallocate(kDevice, addresses[1]).ok());
  EXPECT_EQ(live(), 3u) << "two cached, one live";
  plugin.reset();  // destroy (PLUGIN-9)
  EXPECT_EQ(live(), 0u);
}

TEST_F(VulkanLavapipeCache, GivenTheDriverOutOfMemory_WhenAllocating_ThenTheCacheIsGivenBackAndTheAllocationTriedOnceMore) {
  auto plugin = load_counted();
  ASSERT_TRUE(plugin);
  loader_.limit(start_.live_bytes + 6 * kMiB);
  const uint64_t cached = allocate_on(*plugin, 4 * kMiB);
  ASSERT_TRUE(plugin->deallocate(kDevice, cached).ok());
  // Too small for the cached 4 MiB; 4 + 3 MiB exceed the limit.
  const uint64_t fits = allocate_on(*plugin, 3 * kMiB);
  EXPECT_NE(fits, 0u);
  EXPECT_EQ(loader_.read().refusals - start_.refusals, 1u);
  EXPECT_EQ(live(), 1u) << "the cached buffer was freed for it";
  // Nothing cached to give back: refused once, and out of memory.
  Result<uint64_t> refused = plugin->allocate(kDevice, 4 * kMiB, 0);
  EXPECT_EQ(refused.status().code(), StatusCode::out_of_device_memory) << refused.status().message();
  EXPECT_EQ(loader_.read().refusals - start_.refusals, 2u);
  EXPECT_TRUE(plugin->deallocate(kDevice, fits).ok());
}

TEST_F(VulkanLavapipeCache, GivenAMemoryBudget_WhenAnAllocationIsFreedIntoTheCache_ThenFreeMemoryCountsItAsFree) {
  loader_.offer_budget(true);
  auto plugin = load_counted();
  ASSERT_TRUE(plugin);
  auto free_bytes = [&] {
    const auto info = plugin->memory_info(kDevice);
    EXPECT_TRUE(info.ok() && info->has_value());
    return info.ok() && info->has_value() ? (*info)->free_bytes : 0;
  };
  const uint64_t before = free_bytes();
  const uint64_t address = allocate_on(*plugin, 8 * kMiB);
  EXPECT_LE(free_bytes(), before - 8 * kMiB) << "the budget's usage counts it";
  ASSERT_TRUE(plugin->deallocate(kDevice, address).ok());
  EXPECT_EQ(live(), 1u) << "cached: the driver still counts it as used";
  EXPECT_EQ(free_bytes(), before) << "PLUGIN-10: the cache is free memory";
}

}  // namespace
}  // namespace devalloc::vulkan_test
