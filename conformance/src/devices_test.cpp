// PLUGIN-4, PLUGIN-10, PLUGIN-18: devices, their properties and the
// capabilities, read through the raw table as this host and a newer one would.
#include "suite.hpp"

#include <array>
#include <cstring>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace devalloc::conformance {
namespace {

using Devices = PluginTest;
using Capabilities = PluginTest;
DEVALLOC_CONFORMANCE_RULES(Devices, "PLUGIN-4, PLUGIN-10");
DEVALLOC_CONFORMANCE_RULES(Capabilities, "PLUGIN-4, PLUGIN-11, PLUGIN-18");

constexpr uint8_t kCanary = 0xab;
// Fields a later minor version appends, which a 1.0 plugin must not touch.
constexpr size_t kNewerTail = 64;
constexpr char kUnwritten = 'X';

bool terminated(const char* text, size_t capacity) {
  return std::memchr(text, '\0', capacity) != nullptr;
}

TEST_F(Devices, PluginHasAtLeastOneDevice) {
  EXPECT_GT(device_count(), 0u) << "plugin has no devices to test";
}

TEST_F(Devices, CountThroughTheTable_MatchesWhatTheLoaderSaw) {
  uint32_t count = 0;
  RawError error;
  ASSERT_EQ(api().get_device_count(instance(), &count, error.get()),
            DEVALLOC_STATUS_OK)
      << error.text();
  EXPECT_EQ(count, device_count());
  EXPECT_TRUE(error.untouched()) << "success wrote the error message";
}

TEST_F(Devices, EveryDevice_HasSaneProperties) {
  static const std::regex kPciBusId("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]");
  for (uint32_t device = 0; device < device_count(); ++device) {
    SCOPED_TRACE("device " + std::to_string(device));
    WithSlack<devalloc_device_properties> buffer;
    devalloc_device_properties& p = *buffer;
    std::memset(&p, kUnwritten, sizeof p);
    p.struct_size = sizeof p;
    RawError error;
    ASSERT_EQ(api().get_device_properties(instance(), device, &p, error.get()),
              DEVALLOC_STATUS_OK)
        << error.text();
    ASSERT_TRUE(terminated(p.name, sizeof p.name)) << "name has no NUL";
    EXPECT_STRNE(p.name, "");
    EXPECT_GT(p.total_memory_bytes, 0u);
    ASSERT_TRUE(terminated(p.pci_bus_id, sizeof p.pci_bus_id))
        << "pci_bus_id has no NUL";
    if (p.pci_bus_id[0] != '\0') {
      EXPECT_TRUE(std::regex_match(p.pci_bus_id, kPciBusId))
          << "pci_bus_id \"" << p.pci_bus_id
          << "\" is not dddd:bb:dd.f in lower-case hex";
    }
    EXPECT_TRUE(DEVALLOC_DLPACK_IS_KNOWN(p.dlpack_device_type))
        << "dlpack_device_type " << p.dlpack_device_type
        << " is not a DLPack 1.x device type code (PLUGIN-10)";
    EXPECT_GE(p.dlpack_device_id, 0);
    const DeviceInfo& seen = plugin().devices()[device];
    EXPECT_EQ(seen.name, p.name) << "differs from what the loader saw";
    EXPECT_EQ(seen.total_memory_bytes, p.total_memory_bytes);
  }
}

// The memories of one card share its uuid and differ in memory_kind (ABI
// 1.2, PLUGIN-24); below 1.2 every memory_kind is "".
TEST_F(Devices, DevicesWithAUuid_HaveDistinctUuidsOrMemoryKinds) {
  std::set<std::pair<std::array<uint8_t, 16>, std::string>> seen;
  for (const DeviceInfo& device : plugin().devices()) {
    if (device.has_uuid()) {
      EXPECT_TRUE(seen.insert({device.uuid, device.memory_kind}).second)
          << "device " << device.index << " repeats UUID " << device.uuid_string()
          << " with the same memory_kind \"" << device.memory_kind
          << "\": two devices of one uuid are two memories of one card, told apart by "
             "memory_kind (PLUGIN-10, PLUGIN-24)";
    }
  }
}

TEST_F(Devices, PropertiesOfTheDeviceAtTheCount_AreNoSuchDevice) {
  WithSlack<devalloc_device_properties> buffer;
  devalloc_device_properties& p = *buffer;
  p.struct_size = sizeof p;
  RawError error;
  EXPECT_TRUE(RawFailure(
      api().get_device_properties(instance(), device_count(), &p, error.get()),
      DEVALLOC_STATUS_NO_SUCH_DEVICE, error));
}

TEST_F(Devices, PropertiesStructOfANewerMinorHost_IsFilledAndItsTailLeftAlone) {
  if (device_count() == 0) GTEST_SKIP() << "plugin has no devices to test";
  const size_t newer = sizeof(devalloc_device_properties) + kNewerTail;
  std::vector<uint8_t> bytes(newer + kSlackBytes, kCanary);
  std::memcpy(bytes.data(), &newer, sizeof newer);
  RawError error;
  auto* p = reinterpret_cast<devalloc_device_properties*>(bytes.data());
  ASSERT_EQ(api().get_device_properties(instance(), kDevice, p, error.get()),
            DEVALLOC_STATUS_OK)
      << error.text();
  EXPECT_EQ(p->total_memory_bytes, plugin().devices()[kDevice].total_memory_bytes);
  for (size_t i = sizeof *p; i < bytes.size(); ++i) {
    ASSERT_EQ(bytes[i], kCanary)
        << "wrote byte " << i
        << (i < newer ? " it does not know" : ", beyond the struct_size it was given");
  }
}

TEST_F(Capabilities, MaxAlignment_IsAPowerOfTwoOfAtLeast256) {
  const uint64_t max_alignment = plugin().capabilities().max_alignment;
  EXPECT_GE(max_alignment, 256u);
  EXPECT_EQ(max_alignment & (max_alignment - 1), 0u)
      << max_alignment << " is not a power of two";
}

TEST_F(Capabilities, ThroughTheTable_MatchWhatTheLoaderSaw) {
  WithSlack<devalloc_capabilities> buffer;
  devalloc_capabilities& c = *buffer;
  c.struct_size = sizeof c;
  RawError error;
  ASSERT_EQ(api().get_capabilities(instance(), &c, error.get()),
            DEVALLOC_STATUS_OK)
      << error.text();
  EXPECT_EQ(c.max_alignment, plugin().capabilities().max_alignment);
  EXPECT_EQ((c.flags & DEVALLOC_CAPABILITY_ASYNC_COPY) != 0,
            plugin().capabilities().async_copy);
  EXPECT_EQ((c.flags & DEVALLOC_CAPABILITY_HOST_STAGING) != 0,
            plugin().capabilities().host_staging);
}

// The capability flags each minor of ABI 1 defines.
uint64_t flags_defined_by(uint32_t minor) {
  uint64_t flags = DEVALLOC_CAPABILITY_ASYNC_COPY | DEVALLOC_CAPABILITY_HOST_STAGING;
  if (minor >= 1) flags |= DEVALLOC_CAPABILITY_HOST_ADDRESSABLE;
  if (minor >= 2) flags |= DEVALLOC_CAPABILITY_HOST_MAPPABLE;
  return flags;
}

// "HOST_ADDRESSABLE (bit 2, added in ABI 1.1), bit 7 (no ABI 1.x up to 1.2
// defines it)".
std::string flag_names(uint64_t flags) {
  std::string names;
  for (unsigned bit = 0; bit < 64; ++bit) {
    const uint64_t flag = uint64_t{1} << bit;
    if ((flags & flag) == 0) continue;
    if (!names.empty()) names += ", ";
    if (flag == DEVALLOC_CAPABILITY_HOST_ADDRESSABLE) {
      names += "HOST_ADDRESSABLE (bit 2, added in ABI 1.1)";
    } else if (flag == DEVALLOC_CAPABILITY_HOST_MAPPABLE) {
      names += "HOST_MAPPABLE (bit 3, added in ABI 1.2)";
    } else {
      names += "bit " + std::to_string(bit) + " (no ABI 1.x up to 1." +
               std::to_string(DEVALLOC_ABI_VERSION_MINOR) + " defines it)";
    }
  }
  return names;
}

// A flag of a later minor set by a plugin of an earlier one: a host of the
// later minor would trust it (for HOST_ADDRESSABLE: write through device
// addresses as host pointers), so no test of the suite does, and this one
// fails the plugin for it.
TEST_F(Capabilities, FlagsItsNegotiatedMinorDoesNotDefine_AreNotSet) {
  const uint32_t minor = plugin().abi_minor();
  if (minor > DEVALLOC_ABI_VERSION_MINOR) {
    GTEST_SKIP() << "plugin negotiated ABI 1." << minor << ", newer than this suite's 1."
                 << DEVALLOC_ABI_VERSION_MINOR << ": it may define flags the suite does not know";
  }
  WithSlack<devalloc_capabilities> buffer;
  devalloc_capabilities& c = *buffer;
  c.struct_size = sizeof c;
  RawError error;
  ASSERT_EQ(api().get_capabilities(instance(), &c, error.get()), DEVALLOC_STATUS_OK)
      << error.text();
  const uint64_t undefined = c.flags & ~flags_defined_by(minor);
  if (undefined == 0) return;
  ADD_FAILURE()
      << "the plugin negotiated ABI 1." << minor << " and sets capability flags that 1."
      << minor << " does not define: " << flag_names(undefined)
      << ". A plugin sets only the flags of the minor it negotiated (a 1.0 plugin never "
         "sets a flag that 1.1 added; PLUGIN-18): a host of a later minor takes such a "
         "flag at its word, and HOST_ADDRESSABLE makes it write through device addresses "
         "as host pointers";
}

TEST_F(Capabilities, StructOfANewerMinorHost_IsFilledAndItsTailLeftAlone) {
  const size_t newer = sizeof(devalloc_capabilities) + kNewerTail;
  std::vector<uint8_t> bytes(newer + kSlackBytes, kCanary);
  std::memcpy(bytes.data(), &newer, sizeof newer);
  RawError error;
  auto* c = reinterpret_cast<devalloc_capabilities*>(bytes.data());
  ASSERT_EQ(api().get_capabilities(instance(), c, error.get()),
            DEVALLOC_STATUS_OK)
      << error.text();
  EXPECT_EQ(c->max_alignment, plugin().capabilities().max_alignment);
  for (size_t i = sizeof *c; i < bytes.size(); ++i) {
    ASSERT_EQ(bytes[i], kCanary)
        << "wrote byte " << i
        << (i < newer ? " it does not know" : ", beyond the struct_size it was given");
  }
}

TEST_F(Capabilities, HostStagingFlag_AgreesWithTheStagingFunctions) {
  if (plugin().capabilities().host_staging) {
    EXPECT_NE(api().allocate_host, nullptr);
    EXPECT_NE(api().free_host, nullptr);
  } else {
    EXPECT_STATUS(plugin().allocate_host(4096), StatusCode::unsupported);
  }
}

}  // namespace
}  // namespace devalloc::conformance
