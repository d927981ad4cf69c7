// The OpenCL plugin against the real PoCL driver: what it reports about
// devices, how its copies land (both source lifetimes, any offset), that
// releases come from the driver's event callbacks without any host call,
// host mapping (PLUGIN-22), process-wide unique addresses, its options and
// how failures reach the caller.
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <cstring>
#include <set>
#include <sstream>

#include "opencl_fixture.hpp"

namespace devalloc::opencl_test {
namespace {

constexpr uint32_t kDevice = 0;
constexpr uint64_t kMiB = uint64_t{1} << 20;

using OpenClDevices = OpenClPluginTest;
using OpenClCopies = OpenClPluginTest;
using OpenClMapping = OpenClPluginTest;
using OpenClAllocations = OpenClPluginTest;

// The first device of the first platform, as OpenCL itself reports it:
// what the plugin's device 0 must be.
struct ClTruth {
  std::string name;
  cl_ulong global_memory = 0;
  cl_ulong max_allocation = 0;
  std::string extensions;
};

ClTruth first_device_from_opencl() {
  ClTruth truth;
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  EXPECT_EQ(clGetPlatformIDs(1, &platform, nullptr), CL_SUCCESS);
  EXPECT_EQ(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, nullptr), CL_SUCCESS);
  char text[8192] = {};
  EXPECT_EQ(clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof text, text, nullptr), CL_SUCCESS);
  truth.name = text;
  while (!truth.name.empty() && truth.name.back() == ' ') truth.name.pop_back();
  EXPECT_EQ(clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, sizeof text, text, nullptr), CL_SUCCESS);
  truth.extensions = text;
  clGetDeviceInfo(device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof truth.global_memory,
                  &truth.global_memory, nullptr);
  clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof truth.max_allocation,
                  &truth.max_allocation, nullptr);
  return truth;
}

bool has_extension(const std::string& extensions, const std::string& name) {
  std::istringstream words(extensions);
  for (std::string word; words >> word;) {
    if (word == name) return true;
  }
  return false;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(OpenClDevices, FirstDevice_IsOpenClsFirstDevice_NameMemoryAndOpenClDlpackType) {
  const ClTruth truth = first_device_from_opencl();
  const DeviceInfo& d = plugin().devices()[kDevice];
  EXPECT_EQ(d.name, truth.name);
  EXPECT_EQ(d.total_memory_bytes, truth.global_memory);
  EXPECT_EQ(d.dlpack_device_type, DEVALLOC_DLPACK_OPENCL);
  EXPECT_EQ(d.dlpack_device_id, 0);
  // PoCL offers neither extension: zero and "" (PLUGIN-10).
  if (!has_extension(truth.extensions, "cl_khr_device_uuid")) {
    EXPECT_FALSE(d.has_uuid());
  }
  if (!has_extension(truth.extensions, "cl_khr_pci_bus_info")) {
    EXPECT_EQ(d.pci_bus_id, "");
  }
  const Capabilities& c = plugin().capabilities();
  EXPECT_TRUE(c.async_copy);
  EXPECT_TRUE(c.host_staging);
  EXPECT_TRUE(c.host_mappable);
  EXPECT_FALSE(c.host_addressable) << "addresses are windows, not host pointers";
}

TEST_F(OpenClCopies, UntilReleasedAtManySizesAndOffsets_ReadBackEqual) {
  const uint64_t size = 2 * kMiB + 4096;
  const Result<uint64_t> base = plugin().allocate(kDevice, size, 0);
  ASSERT_TRUE(base.ok()) << base.status().message();
  const std::vector<uint8_t> zeros(size, 0);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base, zeros.data(), size).ok());
  struct Piece {
    uint64_t offset, nbytes;
  };
  const Piece pieces[] = {{0, 1},       {1, 3}, {7, 255}, {4096, 4096 + 7}, {12345, kMiB + 13},
                          {size - 1, 1}};
  std::vector<std::vector<uint8_t>> sources;
  ReleaseCounter counter;
  int seed = 0;
  for (const Piece& p : pieces) {
    sources.push_back(pattern(p.nbytes, ++seed));
    const Status s =
        plugin().copy_to_device_until_released(kDevice, *base + p.offset, sources.back().data(),
                                               p.nbytes, ReleaseCounter::on_release, &counter);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, static_cast<int>(std::size(pieces)));
  // Later pieces overwrite earlier ones where they overlap: the expected
  // bytes are the pieces applied in order.
  std::vector<uint8_t> expected = zeros;
  for (size_t i = 0; i < std::size(pieces); ++i) {
    std::memcpy(expected.data() + pieces[i].offset, sources[i].data(), pieces[i].nbytes);
  }
  EXPECT_EQ(read(*base, size), expected);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(OpenClCopies, DuringCall_SourceOverwrittenAtOnce_DeviceHasTheBytesOfTheCall) {
  const uint64_t size = kMiB + 3;
  const Result<uint64_t> base = plugin().allocate(kDevice, size, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> source = pattern(size - 5, 11);
  const std::vector<uint8_t> expected = source;
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base + 5, source.data(), source.size()).ok());
  // PLUGIN-13: the call has read src; the caller reuses it at once.
  std::memset(source.data(), 0xee, source.size());
  EXPECT_EQ(read(*base + 5, expected.size()), expected);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(OpenClCopies, UntilReleased_ReleasedByTheDriversCallbacks_WithoutSynchronize) {
  constexpr int kCopies = 32;
  constexpr uint64_t kChunk = 64 * 1024;
  const Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> source = pattern(kCopies * kChunk, 3);
  ReleaseCounter counter;
  ASSERT_TRUE(copy_chunks_until_released(*base, source, kCopies, kChunk, counter));
  // No synchronize, no other call: the event callbacks release (PLUGIN-20's
  // "should").
  ASSERT_TRUE(wait_for_releases(counter, kCopies))
      << "only " << counter.releases << " of " << kCopies << " releases came without a synchronize";
  EXPECT_EQ(read(*base, source.size()), source);
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(counter.releases, kCopies) << "a release came twice";
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(OpenClCopies, StagingBuffer_ServesAsTheSourceOfBothLifetimes) {
  const uint64_t size = 256 * 1024;
  const Result<void*> staging = plugin().allocate_host(size);
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  const Result<uint64_t> base = plugin().allocate(kDevice, 2 * size, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> first = pattern(size, 21), second = pattern(size, 22);
  std::memcpy(*staging, first.data(), size);
  ReleaseCounter counter;
  ASSERT_TRUE(plugin()
                  .copy_to_device_until_released(kDevice, *base, *staging, size,
                                                 ReleaseCounter::on_release, &counter)
                  .ok());
  ASSERT_TRUE(wait_for_releases(counter, 1));
  std::memcpy(*staging, second.data(), size);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base + size, *staging, size).ok());
  ASSERT_TRUE(plugin().synchronize(kDevice).ok());
  EXPECT_EQ(read(*base, size), first);
  EXPECT_EQ(read(*base + size, size), second);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
  EXPECT_TRUE(plugin().free_host(*staging).ok());
  const Status again = plugin().free_host(*staging);
  EXPECT_EQ(again.code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(again.message(), "PLUGIN-18")) << again.message();
}

TEST_F(OpenClMapping, WritesThroughAMapping_AreSeenByCopyDeviceToHostAfterUnmap) {
  const uint64_t size = 64 * 1024;
  const Result<uint64_t> base = plugin().allocate(kDevice, size, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> before = pattern(size, 31);
  ASSERT_TRUE(plugin().copy_to_device(kDevice, *base, before.data(), size).ok());

  const uint64_t offset = 1000, nbytes = 20000;
  const Result<void*> host = plugin().map_to_host(kDevice, *base + offset, nbytes);
  ASSERT_TRUE(host.ok()) << host.status().message();
  auto* bytes = static_cast<uint8_t*>(*host);
  // The mapping holds the range's bytes (the copy before it is complete).
  EXPECT_EQ(std::vector<uint8_t>(bytes, bytes + nbytes),
            std::vector<uint8_t>(before.begin() + offset, before.begin() + offset + nbytes));
  const std::vector<uint8_t> written = pattern(nbytes, 32);
  std::memcpy(bytes, written.data(), nbytes);
  ASSERT_TRUE(plugin().unmap_from_host(kDevice, *host).ok());

  std::vector<uint8_t> expected = before;
  std::memcpy(expected.data() + offset, written.data(), nbytes);
  EXPECT_EQ(read(*base, size), expected);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(OpenClMapping, RangeOutsideOneLiveAllocation_IsAnInvalidArgumentNamingPlugin22) {
  const Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_TRUE(base.ok());
  for (const auto& [address, nbytes] :
       {std::pair<uint64_t, uint64_t>{*base + 4000, 97}, {*base - 1, 2}, {*base + 4096, 1}}) {
    const Result<void*> host = plugin().map_to_host(kDevice, address, nbytes);
    ASSERT_FALSE(host.ok()) << "mapped [" << address << ", +" << nbytes << ")";
    EXPECT_EQ(host.status().code(), StatusCode::invalid_argument);
    EXPECT_TRUE(contains(host.status().message(), "PLUGIN-22")) << host.status().message();
  }
  int not_a_mapping = 0;
  const Status s = plugin().unmap_from_host(kDevice, &not_a_mapping);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(s.message(), "PLUGIN-22")) << s.message();
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(OpenClMapping, OneRangeMappedTwice_IsUnmappedOncePerMap) {
  const Result<uint64_t> base = plugin().allocate(kDevice, 8192, 0);
  ASSERT_TRUE(base.ok());
  const Result<void*> first = plugin().map_to_host(kDevice, *base, 4096);
  const Result<void*> second = plugin().map_to_host(kDevice, *base, 4096);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(second.ok()) << second.status().message();
  // PoCL answers both maps with the buffer's own storage: one pointer.
  EXPECT_TRUE(plugin().unmap_from_host(kDevice, *first).ok());
  EXPECT_TRUE(plugin().unmap_from_host(kDevice, *second).ok());
  const Status third = plugin().unmap_from_host(kDevice, *first);
  EXPECT_EQ(third.code(), StatusCode::invalid_argument) << "unmapped more often than mapped";
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST_F(OpenClMapping, FreeingAMappedAllocation_EndsItsMapping) {
  const Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_TRUE(base.ok());
  const Result<void*> host = plugin().map_to_host(kDevice, *base, 4096);
  ASSERT_TRUE(host.ok());
  ASSERT_TRUE(plugin().deallocate(kDevice, *base).ok());
  const Status s = plugin().unmap_from_host(kDevice, *host);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << "the mapping outlived its allocation";
}

TEST_F(OpenClAllocations, AddressesOfTwoInstances_NeverOverlapAndAreAlignedAsAsked) {
  auto [other, error] = load_opencl();
  ASSERT_TRUE(other) << error.status.message();
  struct Live {
    Plugin* plugin;
    uint64_t address, nbytes;
  };
  std::vector<Live> live;
  for (uint64_t alignment : {uint64_t{0}, uint64_t{256}, uint64_t{4096}, 2 * kMiB}) {
    for (Plugin* p : {&plugin(), other.get()}) {
      const uint64_t nbytes = 1000 + alignment / 2;
      const Result<uint64_t> a = p->allocate(kDevice, nbytes, alignment);
      ASSERT_TRUE(a.ok()) << a.status().message();
      EXPECT_EQ(*a % std::max<uint64_t>(alignment, 256), 0u) << "alignment " << alignment;
      live.push_back({p, *a, nbytes});
    }
  }
  for (size_t i = 0; i < live.size(); ++i) {
    for (size_t j = i + 1; j < live.size(); ++j) {
      const bool apart = live[i].address + live[i].nbytes <= live[j].address ||
                         live[j].address + live[j].nbytes <= live[i].address;
      EXPECT_TRUE(apart) << "allocations " << i << " and " << j << " overlap (PLUGIN-12)";
    }
  }
  // One instance's address is not the other's: it refuses to free it.
  const Status foreign = other->deallocate(kDevice, live[0].address);
  EXPECT_EQ(foreign.code(), StatusCode::invalid_argument);
  for (const Live& l : live) EXPECT_TRUE(l.plugin->deallocate(kDevice, l.address).ok());
}

TEST_F(OpenClAllocations, AboveMaxMemAllocSize_IsOutOfDeviceMemorySayingWhy) {
  const ClTruth truth = first_device_from_opencl();
  const Result<uint64_t> a = plugin().allocate(kDevice, truth.max_allocation + 1, 0);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::out_of_device_memory);
  EXPECT_TRUE(contains(a.status().message(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE"))
      << a.status().message();
}

TEST_F(OpenClCopies, DestinationOutsideAnAllocation_IsAnInvalidArgumentAndStillReleased) {
  const Result<uint64_t> base = plugin().allocate(kDevice, 4096, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> source(64, 1);
  ReleaseCounter counter;
  const Status s = plugin().copy_to_device_until_released(
      kDevice, *base + 4090, source.data(), source.size(), ReleaseCounter::on_release, &counter);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(s.message(), "PLUGIN-15")) << s.message();
  EXPECT_EQ(counter.releases, 1);
  EXPECT_TRUE(plugin().deallocate(kDevice, *base).ok());
}

TEST(OpenClOptions, PlatformThatMatchesNothing_GivesNoDevices) {
  auto [plugin, error] = load_opencl({{"platform", "nomatch"}});
  ASSERT_TRUE(plugin) << error.status.message();
  EXPECT_TRUE(plugin->devices().empty());
  EXPECT_FALSE(plugin->capabilities().host_staging) << "staging needs a device's context";
}

TEST(OpenClOptions, PoclPlatformAndCpuType_GiveThePoclDevices) {
  auto [all, all_error] = load_opencl();
  ASSERT_TRUE(all) << all_error.status.message();
  auto [pocl, error] =
      load_opencl({{"platform", "Portable Computing Language"}, {"device_type", "cpu"}});
  ASSERT_TRUE(pocl) << error.status.message();
  ASSERT_FALSE(pocl->devices().empty()) << "no PoCL CPU device";
  EXPECT_EQ(pocl->devices()[0].name, all->devices()[0].name);
  // PoCL has no accelerator device.
  auto [accelerators, accelerator_error] =
      load_opencl({{"platform", "Portable Computing Language"}, {"device_type", "accelerator"}});
  ASSERT_TRUE(accelerators) << accelerator_error.status.message();
  EXPECT_TRUE(accelerators->devices().empty());
}

TEST(OpenClOptions, UnknownOptionOrDeviceType_IsRefusedNamingIt) {
  auto [unknown, error] = load_opencl({{"platfrom", "PoCL"}});
  EXPECT_FALSE(unknown);
  EXPECT_EQ(error.status.code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(error.status.message(), "platfrom")) << error.status.message();
  auto [bad_type, type_error] = load_opencl({{"device_type", "fpga"}});
  EXPECT_FALSE(bad_type);
  EXPECT_EQ(type_error.status.code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(type_error.status.message(), "fpga")) << type_error.status.message();
}

TEST(OpenClOptions, RuntimeLibraryThatDoesNotExist_IsUnavailableNamingThePath) {
  auto [plugin, error] = load_opencl({{"runtime_library", "/nonexistent/libOpenCL.so.1"}});
  EXPECT_FALSE(plugin);
  EXPECT_EQ(error.status.code(), StatusCode::runtime_unavailable);
  EXPECT_TRUE(contains(error.status.message(), "/nonexistent/libOpenCL.so.1"))
      << error.status.message();
}

}  // namespace
}  // namespace devalloc::opencl_test
